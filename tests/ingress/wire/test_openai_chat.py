"""The OpenAI chat adapter: odd but legal shapes real clients send, and typed 400s."""

from __future__ import annotations

import pytest

from ingress.turns.turn import SessionRef
from ingress.wire.errors import OPENAI, status_of
from ingress.wire.http import session_ref
from ingress.wire.openai_chat import parse_request
from titoflow.errors import (
    EngineError,
    InvalidRequest,
    MissingSession,
    Paused,
    PublishFailed,
    SessionAlreadyEnded,
    TemplateError,
    TitoflowError,
)

S = SessionRef(session_id="s")


def body(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_session_from_path_then_header_then_body_then_metadata() -> None:
    assert session_ref("p", {"x-session-id": "h"}, body(session_id="b")).session_id == "p"
    assert session_ref(None, {"x-session-id": "h"}, body(session_id="b")).session_id == "h"
    assert session_ref(None, {}, body(session_id="b")).session_id == "b"
    ref = session_ref(None, {}, body(metadata={"session_id": "m", "turn_id": 3}))
    assert (ref.session_id, ref.turn_id) == ("m", "3")
    headers = {"x-session-id": "h", "x-instance-id": "i", "x-turn-id": "t"}
    ref = session_ref(None, headers, body())
    assert (ref.instance_id, ref.turn_id) == ("i", "t")


def test_shapes_scaffolds_send() -> None:
    messages = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
        },
        {"role": "user", "content": "run ls", "cache_control": {"type": "ephemeral"}},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "sh", "arguments": '{"cmd":"ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.txt"}]},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c2", "function": {"name": "sh", "arguments": {"cmd": "pwd"}}}],
        },
    ]
    turn, _ = parse_request(
        body(messages=messages, reasoning_effort="high", prompt_cache_key="k", stream_options={}), S
    )
    system, user, call, result, call2 = turn.messages
    assert (system.role, system.content) == ("system", "be brief")
    assert user.content == "run ls"
    assert call.content == "" and call.tool_calls[0].arguments == '{"cmd":"ls"}'
    assert result.content == "a.txt" and result.tool_call_id == "c1"
    assert call2.tool_calls[0].arguments == '{"cmd": "pwd"}'
    assert parse_request(body(max_completion_tokens=5, max_tokens=9), S)[0].sampling.max_tokens == 5


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        (body(messages=[]), "messages"),
        (body(messages=[{"role": "robot", "content": "x"}]), "messages.0.role"),
        (body(temperature="hot"), "temperature"),
        (body(max_tokens=0), "max_tokens"),
        (body(n=17), "n"),  # more samples than a session keeps chains for
        (body(n=0), "n"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        (body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages"),
        (["not", "an", "object"], ""),
    ],
)
def test_invalid_requests_are_typed_400s(bad: object, param: str) -> None:
    with pytest.raises(InvalidRequest) as failure:
        parse_request(bad, S)
    assert status_of(failure.value) == 400
    assert (failure.value.param or "").startswith(param)
    shape = OPENAI.body(failure.value)["error"]
    assert shape["type"] == "invalid_request_error" and shape["message"]


def test_unavailable_maps_to_a_retryable_openai_error() -> None:
    shape = OPENAI.body(PublishFailed("broker down"))
    assert shape == {
        "error": {
            "message": "broker down",
            "type": "service_unavailable",
            "param": None,
            "code": "broker_unavailable",
        }
    }


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (TemplateError("t"), 400),
        (MissingSession("m"), 400),
        (Paused("p"), 503),
        (SessionAlreadyEnded("s", "finalized", 1.0), 409),
        (EngineError("e"), 502),
        (TitoflowError("x"), 500),
    ],
)
def test_a_subclass_has_its_nearest_mapped_status(error: TitoflowError, status: int) -> None:
    assert status_of(error) == status

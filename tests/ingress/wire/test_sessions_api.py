"""Session routes and the white-box token API in-process on the SCRIPTED ENGINE DOUBLE: what
``POST /v1/sessions``, finalize, discard and ``/generate`` publish, the session id from
``X-SMG-Routing-Key``, and the error shapes of bad bodies (4xx, nothing published). The same
routes on the real engine: tests/e2e/test_rollout.py."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from ingress.turns.service import ServiceOptions
from ingress.wire import openai_chat, session_routes, token_api
from schemas.events import (
    SessionDiscarded,
    SessionEnded,
    SessionFinalized,
    SessionOpened,
    StepRecorded,
)
from tests.support.apps import asgi_client, scripted_app
from tests.support.doubles import RecordingPublisher
from tests.support.families import qwen3
from titoflow.settings import Settings

ROUTERS = [
    openai_chat.router,
    session_routes.router,
    session_routes.driver_router,
    token_api.router,
]
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def app_for(
    replies: list[str], settings: Settings | None = None
) -> tuple[httpx2.AsyncClient, RecordingPublisher]:
    options = ServiceOptions(max_model_len=4096, default_max_tokens=64, vocab_size=len(qwen3()))
    app, _, publisher = scripted_app(replies, ROUTERS, settings, options)
    return asgi_client(app), publisher


async def test_open_publishes_session_opened_and_returns_base_urls() -> None:
    client, publisher = app_for([])
    body = {
        "instance_id": "prompt-17",
        "channel": "val",
        "metadata": {"data_source": "gsm8k", "task_id": 3},
        "options": {"build_mode": "last-step"},
        "unknown_field": "ignored",
    }
    answer = await client.post("/v1/sessions", json=body)
    assert answer.status_code == 200
    opened = answer.json()
    session = opened["session_id"]
    assert len(session) == 32  # generated
    assert opened["openai_base_url"] == f"http://ingress/sess/{session}/v1"
    assert opened["anthropic_base_url"] == f"http://ingress/sess/{session}"
    assert opened["generate_url"] == f"http://ingress/sess/{session}/generate"
    [event] = publisher.events
    assert isinstance(event, SessionOpened)
    assert (event.session_id, event.instance_id, event.channel) == (session, "prompt-17", "val")
    assert event.metadata == {"data_source": "gsm8k", "task_id": 3}
    assert event.options.build_mode == "last-step"

    public, _ = app_for([], Settings(public_url="https://rl.example/ingress/"))
    given = (await public.post("/v1/sessions", json={"session_id": "run-1:7"})).json()
    assert given["session_id"] == "run-1:7"
    assert given["openai_base_url"] == "https://rl.example/ingress/sess/run-1:7/v1"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"options": {"matcher": "tool_call_id"}}, "options.matcher"),
        ({"options": {"partial_rollout": True}}, "options.partial_rollout"),
        ({"options": {"bild_mode": "concat"}}, "options.bild_mode"),
        ({"options": {"build_mode": "sometimes"}}, "options.build_mode"),
        ({"session_id": "has/slash"}, "session_id"),
        ({"metadata": ["not", "an", "object"]}, "metadata"),
        ({"channel": {"nested": 1}}, "channel"),
        ([1, 2], None),
    ],
)
async def test_bad_open_bodies_are_400_and_publish_nothing(body: Any, param: str | None) -> None:
    client, publisher = app_for([])
    answer = await client.post("/v1/sessions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if param == "options.matcher":
        assert "deployment-wide" in error["message"]
    assert publisher.events == []
    assert (await client.post("/v1/sessions", content=b"{not json")).status_code == 400
    assert publisher.events == []


async def test_finalize_carries_a_reward_and_discard_publishes_a_discard() -> None:
    client, publisher = app_for([])
    scalar = await client.post("/sess/a/finalize", json={"reward": 0.5, "metadata": {"k": 1}})
    named = await client.post(
        "/finalize",
        headers={"X-Session-Id": "b"},
        json={"reward": {"correct": 1, "format": 0.25}},
    )
    dropped = await client.post("/sess/c/discard", json={"metadata": {"why": "timeout"}})
    by_header = await client.post("/discard", headers={"X-SMG-Routing-Key": "d"})
    assert [r.status_code for r in (scalar, named, dropped, by_header)] == [200] * 4
    assert dropped.json() == {"session_id": "c", "discarded": True}
    a, b, c, d = [e for e in publisher.events if not isinstance(e, SessionEnded)]
    ends = [(e.session_id, e.how) for e in publisher.events if isinstance(e, SessionEnded)]
    assert ends == [("a", "finalized"), ("b", "finalized"), ("c", "discarded"), ("d", "discarded")]
    assert isinstance(a, SessionFinalized) and (a.reward, a.metadata) == (0.5, {"k": 1})
    assert isinstance(b, SessionFinalized) and b.session_id == "b" and b.reward is None
    assert b.reward_components == {"correct": 1.0, "format": 0.25}
    assert isinstance(c, SessionDiscarded) and c.metadata == {"why": "timeout"}
    assert isinstance(d, SessionDiscarded) and d.session_id == "d"

    for path, body in [
        ("/sess/e/finalize", {"reward": "high"}),
        ("/sess/e/finalize", {"reward": {"correct": "yes"}}),
        ("/sess/e/discard", {"reward": 1.0}),
        ("/discard", {}),  # no session anywhere
    ]:
        answer = await client.post(path, json=body)
        assert answer.status_code == 400, (path, body)
        assert answer.json()["error"]["type"] == "invalid_request_error"
    assert len(publisher.events) == 8


async def test_a_session_ends_once_a_second_end_is_a_409_naming_the_first() -> None:
    client, publisher = app_for([])
    first = await client.post("/sess/a/finalize", json={"reward": 1.0})
    assert first.status_code == 200
    for path, body in [
        ("/sess/a/finalize", {"reward": 0.0}),
        ("/sess/a/discard", {}),
        ("/finalize", {}),  # the session by header, below
    ]:
        answer = await client.post(path, json=body, headers={"X-Session-Id": "a"})
        assert answer.status_code == 409, (path, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "session_ended" and error["type"] == "invalid_request_error"
        assert error["ended"] == {"how": "finalized", "at": publisher.events[0].event_time}
        assert "finalized by the rollout driver at" in error["message"]
    assert (await client.post("/sess/b/discard")).status_code == 200
    again = await client.post("/sess/b/finalize", json={"reward": 1.0})
    assert again.status_code == 409 and again.json()["error"]["ended"]["how"] == "discarded"
    assert [type(e).__name__ for e in publisher.events] == [
        "SessionFinalized",
        "SessionEnded",
        "SessionDiscarded",
        "SessionEnded",
    ]

    # An end the broker did not take did not happen: the driver's retry goes through.
    publisher.fail_next = True
    failed = await client.post("/sess/c/finalize", json={"reward": 1.0})
    assert failed.status_code == 503
    retried = await client.post("/sess/c/finalize", json={"reward": 1.0})
    assert retried.status_code == 200 and len(publisher.events) == 6


async def test_routing_key_names_the_session_when_x_session_id_is_absent() -> None:
    client, publisher = app_for(["one<|im_end|>", "two<|im_end|>"])
    routed = await client.post(
        "/v1/chat/completions", json=CHAT, headers={"X-SMG-Routing-Key": "routed"}
    )
    both = await client.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={"X-SMG-Routing-Key": "routed", "X-Session-Id": "explicit"},
    )
    assert routed.status_code == both.status_code == 200
    assert [e.session_id for e in publisher.events] == ["routed", "explicit"]


async def test_generate_records_a_step_that_extends_the_chat_chain() -> None:
    tokenizer = qwen3()
    client, publisher = app_for(["Hello<|im_end|>", "more text"])
    chat = await client.post("/sess/s/v1/chat/completions", json=CHAT)
    assert chat.status_code == 200
    [first] = publisher.events
    assert isinstance(first, StepRecorded)
    prompt = [*first.prompt_tail_ids, *first.completion_ids]
    appended = tokenizer.encode("\nuser says more", add_special_tokens=False)
    answer = await client.post(
        "/sess/s/generate",
        json={"input_ids": prompt + appended, "sampling_params": {"max_new_tokens": 8}},
    )
    assert answer.status_code == 200
    body = answer.json()
    second = publisher.events[1]
    assert isinstance(second, StepRecorded) and second.api == "generate"
    assert (second.prefix, second.parent_step_id, second.prefix_len) == (
        "tito",
        first.step_id,
        len(prompt),
    )
    assert second.prompt_tail_ids == appended and second.chain_id == first.chain_id
    assert body["token_ids"] == second.completion_ids == tokenizer.encode("more text")
    assert body["logprobs"] == second.completion_logprobs
    assert (body["step_id"], body["prefix"], body["prompt_tokens"]) == (
        second.step_id,
        "tito",
        len(prompt) + len(appended),
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input_ids"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": ["a"]}, "input_ids.0"),
        ({"input_ids": [1, 10**9]}, "input_ids"),
        ({"input_ids": [-1]}, "input_ids"),
        ({"input_ids": [1], "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens"),
        ({"input_ids": [1], "sampling_params": {"stop": ["x"]}}, "sampling_params.stop"),
        ({"input_ids": [1], "sampling_params": {"top_p": 2}}, "sampling_params.top_p"),
        ([1, 2, 3], None),
    ],
)
async def test_bad_generate_bodies_are_400_and_publish_nothing(
    body: Any, param: str | None
) -> None:
    client, publisher = app_for(["never used"])
    answer = await client.post("/sess/s/generate", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    missing = await client.post("/generate", json={"input_ids": [1]})
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "missing_session"
    assert publisher.events == []

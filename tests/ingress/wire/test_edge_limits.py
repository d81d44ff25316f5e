"""The HTTP edge's limits, case by case (issue 26's table and what the fuzz of
tests/ingress/wire/test_edge_fuzz.py found), in-process on the SCRIPTED ENGINE DOUBLE: bodies nested
too deep, numbers beyond a double, lone surrogates, tool names and session ids of the wrong type or
form, an odd Content-Length. Each refusal is a 4xx in its API's shape naming what is wrong,
with nothing published."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from ingress.turns.service import ServiceOptions
from ingress.wire import (
    anthropic_messages,
    openai_chat,
    openai_responses,
    session_routes,
    token_api,
)
from schemas.events import StepRecorded
from tests.support.apps import asgi_client, scripted_app
from tests.support.doubles import RecordingPublisher, ScriptedEngine
from tests.support.families import qwen3
from titoflow.settings import Settings

ROUTERS = [
    openai_chat.router,
    anthropic_messages.router,
    openai_responses.router,
    session_routes.router,
    session_routes.driver_router,
    token_api.router,
]
REPLY = "Done.<|im_end|>"
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES: dict[str, Any] = {**CHAT, "max_tokens": 8}
RESPONSES: dict[str, Any] = {"model": "m", "input": "hi"}
GENERATE: dict[str, Any] = {"input_ids": [1, 2, 3]}
BODIES = {
    "/sess/s1/v1/chat/completions": CHAT,
    "/sess/s1/v1/messages": MESSAGES,
    "/sess/s1/v1/messages/count_tokens": CHAT,
    "/sess/s1/v1/responses": RESPONSES,
    "/sess/s1/generate": GENERATE,
    "/sess/s1/finalize": {"reward": 1.0},
    "/v1/sessions": {"session_id": "s2"},
}


def app_for(
    replies: int = 0, settings: Settings | None = None
) -> tuple[httpx2.AsyncClient, ScriptedEngine, RecordingPublisher]:
    options = ServiceOptions(max_model_len=4096, default_max_tokens=8, vocab_size=len(qwen3()))
    app, engine, publisher = scripted_app([REPLY] * replies, ROUTERS, settings, options)
    return asgi_client(app), engine, publisher


def error_of(path: str, answer: httpx2.Response) -> dict[str, Any]:
    """The error in the answer, held to its API's shape: Anthropic's on /v1/messages, else
    OpenAI's."""
    body = answer.json()
    if "/v1/messages" in path:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        error: dict[str, Any] = body["error"]
        return error
    assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    error = body["error"]
    return error


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    "body",
    [
        deep(100_000),  # the issue's: orjson stops at 1,024 levels, json recursed into a 500
        b'["\\ud800",' + deep(5_000) + b"]",  # orjson refuses the surrogate first: json alone
        b'{"a": ' + deep(129) + b"}",  # within both parsers, beyond the default limit
    ],
    ids=["100k-arrays", "surrogate-then-5k", "129-levels"],
)
async def test_a_body_nested_too_deep_is_a_400_in_its_apis_shape(path: str, body: bytes) -> None:
    client, engine, publisher = app_for()
    answer = await client.post(path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = error_of(path, answer)
    assert "more than 128 levels deep" in error["message"]
    assert "TITOFLOW_MAX_JSON_DEPTH" in error["message"]
    assert not publisher.events and not engine.prompts


@pytest.mark.parametrize(("levels", "status"), [(128, 200), (129, 400)])
async def test_the_depth_of_what_orjson_cannot_write_is_walked(levels: int, status: int) -> None:
    """An integer beyond 64 bits (read by the standard library, here after a lone surrogate)
    makes orjson refuse the body for a reason other than its depth: the depth is still held."""
    client, _, publisher = app_for(replies=1)
    raw = json.dumps({**CHAT, "metadata": {"s": "\ud800", "n": 2**70, "x": "X"}}).encode()
    raw = raw.replace(b'"X"', deep(levels - 2))  # inside the body and its metadata
    answer = await client.post("/sess/s1/v1/chat/completions", content=raw)
    assert answer.status_code == status, answer.text
    assert len(publisher.events) == (status == 200)


async def test_the_depth_limit_is_its_setting_exactly() -> None:
    client, _, publisher = app_for(replies=1, settings=Settings(max_json_depth=16))

    def body(levels: int) -> bytes:
        # The body is one level; "x" adds ``levels - 1``.
        raw = json.dumps({**CHAT, "x": "X"}).encode()
        return raw.replace(b'"X"', deep(levels - 1))

    refused = await client.post("/sess/s1/v1/chat/completions", content=body(17))
    assert refused.status_code == 400
    assert "more than 16 levels deep" in refused.json()["error"]["message"]
    taken = await client.post("/sess/s1/v1/chat/completions", content=body(16))
    assert taken.status_code == 200, taken.text
    assert len(publisher.events) == 1


@pytest.mark.parametrize("literal", [b"1e999", b"-1e400"])
async def test_a_number_beyond_a_double_is_refused(literal: bytes) -> None:
    """json would read it as ±inf, which no JSON writer carries back."""
    client, _, publisher = app_for()
    raw = json.dumps({**CHAT, "metadata": {"x": "X"}}).encode().replace(b'"X"', literal)
    answer = await client.post("/sess/s1/v1/chat/completions", content=raw)
    assert answer.status_code == 400
    assert "beyond the range of a double" in answer.json()["error"]["message"]
    assert not publisher.events


async def test_lone_surrogates_reach_the_policy_as_replacement_characters() -> None:
    """What a client sends that cut a UTF-16 string between the halves of a pair: no tokenizer
    takes it (it was a 500), so each becomes U+FFFD, the same on every re-send."""
    client, engine, publisher = app_for(replies=2)
    raw = json.dumps({**CHAT, "messages": [{"role": "user", "content": "a\ud800b \U0001f600"}]})
    for _ in range(2):
        answer = await client.post("/sess/s1/v1/chat/completions", content=raw.encode())
        assert answer.status_code == 200, answer.text
    prompt = qwen3().decode(engine.prompts[0])
    assert "a\ufffdb \U0001f600" in prompt
    assert engine.prompts[1][: len(engine.prompts[0])] == engine.prompts[0]
    assert len(publisher.events) == 2


def chat_tool(name: Any) -> dict[str, Any]:
    function = {"name": name, "parameters": {"type": "object", "properties": {}}}
    return {"type": "function", "function": function}


TOOLS = {
    "/sess/s1/v1/chat/completions": (CHAT, chat_tool, "tools.0.function.name"),
    "/sess/s1/v1/messages": (
        MESSAGES,
        lambda name: {"name": name, "input_schema": {"type": "object"}},
        "tools.0.name",
    ),
    "/sess/s1/v1/responses": (
        RESPONSES,
        lambda name: {"type": "function", "name": name, "parameters": {"type": "object"}},
        "tools.0.name",
    ),
}


@pytest.mark.parametrize("path", list(TOOLS))
@pytest.mark.parametrize("name", [7, None, "", "run bash", "a" * 129, "bash\n", "tool()"])
async def test_a_tool_name_that_is_no_name_is_a_400_naming_the_field(path: str, name: Any) -> None:
    client, _, publisher = app_for()
    seed, tool, field = TOOLS[path]
    answer = await client.post(path, json={**seed, "tools": [tool(name)]})
    assert answer.status_code == 400, answer.text
    assert error_of(path, answer)["message"].startswith(field)
    assert not publisher.events


@pytest.mark.parametrize("path", list(TOOLS))
@pytest.mark.parametrize(
    "name", ["mcp__github__create_issue", "Bash", "exec_command", "code.search"]
)
async def test_scaffolds_tool_names_are_taken(path: str, name: str) -> None:
    client, _, publisher = app_for(replies=1)
    seed, tool, _ = TOOLS[path]
    answer = await client.post(path, json={**seed, "tools": [tool(name)]})
    assert answer.status_code == 200, answer.text
    assert len(publisher.events) == 1


async def test_a_chat_tool_of_the_wrong_shape_is_a_400_naming_the_field() -> None:
    client, _, publisher = app_for()
    for tool, field in (
        (7, "tools.0"),
        ({"type": "function", "function": 7}, "tools.0.function"),
        ({"type": {"x": 1}, "function": chat_tool("f")["function"]}, "tools.0.type"),
        ({"type": "function", "function": {"name": "f", "parameters": [1]}}, "tools.0.function"),
        ({"type": "function", "function": {"name": "f", "description": 7}}, "tools.0.function"),
    ):
        answer = await client.post("/sess/s1/v1/chat/completions", json={**CHAT, "tools": [tool]})
        assert answer.status_code == 400, (tool, answer.text)
        assert answer.json()["error"]["param"].startswith(field), answer.json()
    answer = await client.post("/sess/s1/v1/responses", json={**RESPONSES, "tools": [{"type": 7}]})
    assert answer.json()["error"]["param"] == "tools.0.type"
    assert not publisher.events


LONG = "s" * 5_000


@pytest.mark.parametrize(
    ("path", "headers", "body"),
    [
        (f"/sess/{LONG}/v1/chat/completions", {}, CHAT),
        ("/v1/chat/completions", {"x-session-id": LONG}, CHAT),
        ("/v1/chat/completions", {"x-session-id": "a b"}, CHAT),
        ("/v1/chat/completions", {"x-smg-routing-key": "s/1"}, CHAT),
        ("/v1/chat/completions", {}, {**CHAT, "session_id": LONG}),
        ("/v1/chat/completions", {}, {**CHAT, "session_id": True}),
        ("/v1/chat/completions", {}, {**CHAT, "session_id": ["s1"]}),
        ("/v1/messages", {}, {**MESSAGES, "metadata": {"session_id": "é"}}),
        ("/v1/responses", {}, {**RESPONSES, "session_id": "-lead"}),
        ("/generate", {}, {**GENERATE, "session_id": "x" * 129}),
        ("/finalize", {}, {"session_id": {"id": "s1"}}),
        ("/discard", {"x-session-id": "s1\n"}, {}),
    ],
)
async def test_a_session_id_that_is_no_session_id_is_a_400(
    path: str, headers: dict[str, str], body: dict[str, Any]
) -> None:
    """Session ids become URL paths, Kafka keys and metric labels: 1 to 128 of [A-Za-z0-9._:-]."""
    client, engine, publisher = app_for()
    answer = await client.post(path, json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    error = error_of(path, answer)
    assert "is not a session id" in error["message"]
    assert not publisher.events and not engine.prompts


async def test_a_session_id_read_by_the_driver_routes_is_checked_too() -> None:
    client, _, _ = app_for()
    for path in (f"/v1/sessions/{LONG}", f"/sess/{LONG}", f"/sess/{LONG}/v1"):
        answer = await client.get(path)
        assert answer.status_code == 400, (path, answer.text)
        assert "is not a session id" in answer.json()["error"]["message"]
    assert (await client.get("/v1/sessions/run-1:7.a_b")).status_code == 200


async def test_numeric_ids_are_taken_as_their_digits() -> None:
    client, _, publisher = app_for(replies=1)
    answer = await client.post(
        "/v1/chat/completions", json={**CHAT, "session_id": 17, "instance_id": 3}
    )
    assert answer.status_code == 200, answer.text
    step = publisher.events[0]
    assert isinstance(step, StepRecorded)
    assert (step.session_id, step.instance_id) == ("17", "3")


async def test_an_instance_id_of_the_wrong_type_is_a_400_naming_it() -> None:
    client, _, publisher = app_for()
    answer = await client.post(
        "/sess/s1/v1/chat/completions", json={**CHAT, "metadata": {"instance_id": {"a": 1}}}
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "metadata.instance_id"
    assert not publisher.events


@pytest.mark.parametrize("declared", ["²", "-1", "", "1e3", "99999999999999999999"])
async def test_an_odd_content_length_never_breaks_the_body_limit(declared: str) -> None:
    """``"²".isdigit()`` is true and ``int("²")`` fails: that was a 500."""
    client, _, _ = app_for(replies=1)
    answer = await client.post(
        "/sess/s1/v1/chat/completions",
        content=json.dumps(CHAT).encode(),
        headers={b"content-length": declared.encode("latin-1")},
    )
    expected = 413 if declared == "99999999999999999999" else 200
    assert answer.status_code == expected, answer.text

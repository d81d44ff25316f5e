"""The Anthropic messages adapter on the SCRIPTED ENGINE DOUBLE, driven by the official
``anthropic`` SDK and by raw requests shaped like Claude Code's: request mapping, responses,
the exact SSE event sequence, TITO across a tool round trip, and typed errors in Anthropic's
shape with nothing published."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from anthropic.types import (
    MessageParam,
    RawContentBlockDeltaEvent,
    ThinkingBlock,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlock,
)
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException

from ingress.turns.turn import SessionRef
from ingress.wire import anthropic_messages
from ingress.wire.anthropic_messages import parse_count_request, parse_request
from ingress.wire.errors import unknown_route_response
from tests.support.apps import asgi_client, scripted_app
from tests.support.doubles import RecordingPublisher, ScriptedEngine
from tests.support.families import qwen3
from titoflow.errors import InvalidRequest
from titoflow.settings import Settings

CALL_LS = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
THINK = "<think>\nplan\n</think>\n\nanswer<|im_end|>"
BASH: ToolParam = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
MESSAGES = "/sess/s1/v1/messages"
ASK: list[MessageParam] = [{"role": "user", "content": "list the files"}]

S = SessionRef(session_id="s")


def app_for(
    replies: list[str], settings: Settings | None = None
) -> tuple[FastAPI, ScriptedEngine, RecordingPublisher]:
    app, engine, publisher = scripted_app(replies, [anthropic_messages.router], settings)
    # The ingress app answers unknown paths in the shape of the API they fall under.
    app.add_exception_handler(StarletteHTTPException, unknown_route_response)
    return app, engine, publisher


def sdk(app: FastAPI, session: str = "s1", max_retries: int = 0) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"http://ingress/sess/{session}",
        api_key="k",
        http_client=asgi_client(app),
        max_retries=max_retries,
    )


def sse_events(text: str) -> list[dict[str, Any]]:
    """Parsed SSE frames; each frame's ``event:`` line must name its data's type."""
    events = []
    for frame in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.splitlines())
        payload = json.loads(fields["data"])
        assert fields["event"] == payload["type"]
        events.append(payload)
    return events


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": ASK, **extra}


# --- request mapping ------------------------------------------------------------------------


def test_blocks_map_to_messages_in_order() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "run ls and pwd"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Running."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "pwd"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "/tmp"}],
                    "is_error": True,
                    "cache_control": {"type": "ephemeral"},
                },
                {"type": "text", "text": "now delete a.txt"},
            ],
        },
        {"role": "system", "content": "mid-conversation reminder"},
    ]
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2"},
        {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
    ]
    turn, _ = parse_request(body(messages=messages, system=system), S)
    assert [(m.role, m.content) for m in turn.messages] == [
        ("system", "x-anthropic-billing-header: cc_version=2\nYou are an agent."),
        ("user", "run ls and pwd"),
        ("assistant", "Running."),
        ("tool", "a.txt"),
        ("tool", "/tmp"),
        ("user", "now delete a.txt"),
        ("system", "mid-conversation reminder"),
    ]
    assistant = turn.messages[2]
    assert assistant.reasoning == "two calls"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assistant.tool_calls] == [
        ("toolu_1", "Bash", {"command": "ls"}),
        ("toolu_2", "Bash", {"command": "pwd"}),
    ]
    assert [m.tool_call_id for m in turn.messages[3:5]] == ["toolu_1", "toolu_2"]
    assert turn.api == "anthropic.messages"


def test_tools_sampling_and_switches() -> None:
    server_tool = {"type": "web_search_20250305", "name": "web_search"}
    turn, raw = parse_request(
        body(
            tools=[{**BASH, "cache_control": {"type": "ephemeral"}}, server_tool],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            temperature=0.5,
            top_p=0.9,
            stop_sequences=["Observation:"],
            thinking={"type": "enabled", "budget_tokens": 1024},
            metadata={"user_id": json.dumps({"device_id": "d"})},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            output_config={"effort": "high"},
            service_tier="auto",
            stream=True,
        ),
        S,
    )
    assert turn.tools == (
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "description": "Run a shell command",
                "parameters": BASH["input_schema"],
            },
        },
    )
    assert (turn.tool_choice, turn.tool_choice_name) == ("required", None)
    sampling = turn.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (64, 0.5, 0.9)
    assert sampling.stop == ("Observation:",)
    assert turn.template_kwargs == {"enable_thinking": True}
    assert raw.stream

    def mapped(**extra: Any) -> tuple[Any, ...]:
        turn = parse_request(body(tools=[BASH], **extra), S)[0]
        return turn.tool_choice, turn.tool_choice_name, turn.template_kwargs

    assert mapped() == ("auto", None, {})
    assert mapped(tool_choice={"type": "auto"}) == ("auto", None, {})
    assert mapped(tool_choice={"type": "none"}) == ("none", None, {})
    assert mapped(tool_choice={"type": "tool", "name": "Bash"}) == ("named", "Bash", {})
    assert mapped(thinking={"type": "adaptive"})[2] == {"enable_thinking": True}
    assert mapped(thinking={"type": "disabled"})[2] == {"enable_thinking": False}


def test_count_tokens_needs_no_max_tokens_and_no_session() -> None:
    turn = parse_count_request({"model": "m", "messages": ASK})
    assert turn.messages[0].content == "list the files"


@pytest.mark.parametrize(
    ("bad", "param", "words"),
    [
        ({"model": "m", "messages": ASK}, "max_tokens", "required"),
        (body(max_tokens=0), "max_tokens", "greater"),
        (body(temperature="hot"), "temperature", "number"),
        (body(messages="hi"), "messages", "list"),
        (body(messages=[]), "messages", "at least 1"),
        (body(messages=[{"role": "robot", "content": "x"}]), "messages.0.role", "user"),
        (body(tool_choice={"type": "tool"}), "tool_choice.name", "name"),
        (body(tools=[{"name": "t"}]), "tools.0.input_schema", "input_schema"),
        (
            body(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
            "messages.0.content.0",
            "document blocks are not supported",
        ),
        (
            body(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "document"}],
                            }
                        ],
                    }
                ]
            ),
            "messages.0.content.0.content.0",
            "document blocks are not supported",
        ),
        (
            body(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}],
                    }
                ]
            ),
            "messages.0.content.0",
            "user message cannot hold tool_use",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "hologram"}]}]),
            "messages.0.content.0",
            "hologram",
        ),
        (["not", "an", "object"], "", "valid dictionary"),
    ],
)
def test_invalid_requests_are_typed_400s(bad: Any, param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as failure:
        parse_request(bad, S)
    assert (failure.value.param or "").startswith(param)
    assert words in failure.value.message


# --- responses over the SDK -------------------------------------------------------------------


async def test_text_reply() -> None:
    app, engine, publisher = app_for(["Hello there<|im_end|>"])
    async with sdk(app) as client:
        message = await client.messages.create(model="m", max_tokens=64, messages=ASK)
    [step] = publisher.steps()
    assert message.id == f"msg_{step.step_id}"
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
        ("text", "Hello there")
    ]
    assert (message.stop_reason, message.stop_sequence, message.model) == ("end_turn", None, "m")
    assert message.usage.input_tokens == len(engine.prompts[0])
    assert message.usage.output_tokens == len(step.completion_ids)
    assert (step.api, step.stream, step.session_id) == ("anthropic.messages", False, "s1")


async def test_max_tokens_stop_reason() -> None:
    app, _, _ = app_for(["one two three four five six seven"])
    async with sdk(app) as client:
        message = await client.messages.create(model="m", max_tokens=3, messages=ASK)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


async def test_thinking_reply() -> None:
    app, _, _ = app_for([THINK])
    async with sdk(app) as client:
        message = await client.messages.create(
            model="m", max_tokens=64, messages=ASK, thinking={"type": "adaptive"}
        )
    thinking, text = message.content
    assert isinstance(thinking, ThinkingBlock) and thinking.thinking == "plan"
    assert text.type == "text" and text.text == "answer"


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_round_trip_continues_the_chain(stream: bool) -> None:
    app, engine, publisher = app_for([CALL_LS, "Two files.<|im_end|>"])
    conversation = list(ASK)
    message: anthropic.types.Message
    async with sdk(app) as client:
        for _ in range(2):
            if stream:
                async with client.messages.stream(
                    model="m", max_tokens=64, messages=conversation, tools=[BASH]
                ) as events:
                    message = await events.get_final_message()
            else:
                message = await client.messages.create(
                    model="m", max_tokens=64, messages=conversation, tools=[BASH]
                )
            conversation.append({"role": "assistant", "content": message.content})
            if message.stop_reason == "tool_use":
                [call] = message.content
                assert isinstance(call, ToolUseBlock)
                assert (call.name, call.input) == ("Bash", {"command": "ls"})
                assert call.id.startswith("toolu_")
                result: ToolResultBlockParam = {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": "a b",
                }
                conversation.append({"role": "user", "content": [result]})
    first, second = publisher.steps()
    assert message.stop_reason == "end_turn" and message.content[0].type == "text"
    assert (first.prefix, second.prefix) == ("rendered", "tito")
    assert second.parent_step_id == first.step_id and second.chain_id == first.step_id
    assert [s.stream for s in (first, second)] == [stream, stream]
    # The echoed call's id is the one the service made, and the result points at it.
    call_id = first.response_message["tool_calls"][0]["id"]
    assert second.new_messages == [{"role": "tool", "content": "a b", "tool_call_id": call_id}]
    assert engine.prompts[1][: second.prefix_len] == engine.prompts[0] + first.completion_ids


async def test_stream_event_sequence_with_thinking_text_and_tool() -> None:
    app, _, publisher = app_for(["<think>\nplan\n</think>\n\nLet me look." + CALL_LS])
    async with sdk(app) as client:
        stream = await client.messages.create(
            model="m", max_tokens=64, messages=ASK, tools=[BASH], stream=True
        )
        raw = [event async for event in stream]
    kinds: list[str] = []
    for event in raw:  # consecutive deltas of one block count once
        kind: str = event.type
        if isinstance(event, RawContentBlockDeltaEvent):
            kind += f":{event.index}:{event.delta.type}"
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta:0:thinking_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta:1:text_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta:2:input_json_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    [step] = publisher.steps()
    start, delta = raw[0], raw[-2]
    assert start.type == "message_start" and start.message.id == f"msg_{step.step_id}"
    assert start.message.content == [] and start.message.usage.output_tokens == 0
    assert delta.type == "message_delta" and delta.delta.stop_reason == "tool_use"
    assert delta.usage.output_tokens == len(step.completion_ids) and step.stream


async def test_stream_final_message_matches_non_streaming() -> None:
    reply = "<think>\nplan\n</think>\n\nLet me look." + CALL_LS
    app, _, publisher = app_for([reply, reply])
    async with sdk(app, "a") as client:
        plain = await client.messages.create(model="m", max_tokens=64, messages=ASK, tools=[BASH])
    async with (
        sdk(app, "b") as client,
        client.messages.stream(model="m", max_tokens=64, messages=ASK, tools=[BASH]) as events,
    ):
        streamed = await events.get_final_message()
    # Same tokens in another session: the same message apart from ids.
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [
        b.model_dump(exclude={"id"}) for b in plain.content
    ]
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (
        plain.stop_reason,
        plain.usage.output_tokens,
    )
    assert [s.stream for s in publisher.steps()] == [False, True]


async def test_count_tokens_matches_the_prompt_sent() -> None:
    app, engine, publisher = app_for(["ok<|im_end|>"])
    system = "You are terse."
    async with sdk(app) as client:
        counted = await client.messages.count_tokens(
            model="m", messages=ASK, system=system, tools=[BASH]
        )
        await client.messages.create(
            model="m", max_tokens=8, messages=ASK, system=system, tools=[BASH]
        )
    assert counted.input_tokens == len(engine.prompts[0])
    async with asgi_client(app) as raw:  # the session-less form counts too
        response = await raw.post("/v1/messages/count_tokens", json={"model": "m", "messages": ASK})
    assert response.status_code == 200 and response.json()["input_tokens"] > 0
    assert len(publisher.events) == 1  # counting records nothing


# --- what Claude Code sends -------------------------------------------------------------------

CLAUDE_CODE_HEADERS = {
    "x-api-key": "sk-anything",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,context-1m-2025-08-07,interleaved-thinking-2025-05-14,"
    "context-management-2025-06-27,mid-conversation-system-2026-04-07,effort-2025-11-24",
    "x-app": "cli",
    "anthropic-dangerous-direct-browser-access": "true",
}


def claude_code_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "claude-opus-4-8",
        "max_tokens": 64000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197"},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "messages": messages,
        "tools": [{**BASH, "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "x"})},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }


async def test_claude_code_shaped_tool_round_trip() -> None:
    app, engine, publisher = app_for([CALL_LS, "Done.<|im_end|>"])
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
        {"role": "system", "content": "<system-reminder>today is Friday</system-reminder>"},
    ]
    url = "/sess/cc/v1/messages?beta=true"
    async with asgi_client(app) as client:
        first = await client.post(url, json=claude_code_body(messages), headers=CLAUDE_CODE_HEADERS)
        events = sse_events(first.text)
        [tool_use] = [
            e["content_block"]
            for e in events
            if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
        ]
        arguments = "".join(
            e["delta"]["partial_json"]
            for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
        )
        # Claude Code echoes the call with its input re-serialized, and the result with extras.
        messages += [
            {
                "role": "assistant",
                "content": [{**tool_use, "input": json.loads(arguments)}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": tool_use["id"],
                        "content": "a.txt",
                        "is_error": False,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ]
        second = await client.post(
            url, json=claude_code_body(messages), headers=CLAUDE_CODE_HEADERS
        )
    assert first.status_code == second.status_code == 200
    assert first.headers["content-type"].startswith("text/event-stream")
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-1]["type"] == "message_stop"
    assert json.loads(arguments) == {"command": "ls"}
    done = sse_events(second.text)
    assert done[-2]["delta"]["stop_reason"] == "end_turn"
    first_step, second_step = publisher.steps()
    assert second_step.prefix == "tito" and second_step.parent_step_id == first_step.step_id
    assert first_step.session_id == "cc" and first_step.model == "claude-opus-4-8"
    prompt = qwen3().decode(engine.prompts[0])
    assert "x-anthropic-billing-header: cc_version=2.1.197\nYou are Claude Code." in prompt
    assert prompt.index("list the files") < prompt.index("today is Friday")


@pytest.mark.parametrize(
    "headers",
    [
        {"x-api-key": "k", "anthropic-version": "2023-06-01"},
        {"authorization": "Bearer k", "anthropic-version": "2026-10-21"},
        {"anthropic-version": "1999-01-01", "anthropic-beta": "anything-2030-01-01"},
    ],
)
async def test_any_key_and_version_is_accepted(headers: dict[str, str]) -> None:
    app, _, publisher = app_for(["hi<|im_end|>"])
    async with asgi_client(app) as client:
        response = await client.post("/sess/s1/v1/messages?beta=true", json=body(), headers=headers)
    assert response.status_code == 200 and response.json()["content"][0]["text"] == "hi"
    assert len(publisher.events) == 1


async def test_session_from_header_on_the_plain_route() -> None:
    app, _, publisher = app_for(["hi<|im_end|>"])
    async with asgi_client(app) as client:
        response = await client.post("/v1/messages", json=body(), headers={"x-session-id": "h"})
    assert response.status_code == 200 and publisher.steps()[0].session_id == "h"


# --- errors in Anthropic's shape, nothing published -------------------------------------------


IMAGE = {"role": "user", "content": [{"type": "image", "source": {}}]}


@pytest.mark.parametrize(
    ("path", "content", "status", "kind"),
    [
        (MESSAGES, b"{not json", 400, "invalid_request_error"),
        (MESSAGES, json.dumps({"model": "m", "messages": ASK}), 400, "invalid_request_error"),
        (MESSAGES, json.dumps(body(max_tokens="many")), 400, "invalid_request_error"),
        (MESSAGES, json.dumps(body(messages=[IMAGE])), 400, "invalid_request_error"),
        ("/v1/messages", json.dumps(body()), 400, "invalid_request_error"),  # no session
        (f"{MESSAGES}/count_tokens", b"[]", 400, "invalid_request_error"),
        (f"{MESSAGES}/batches", json.dumps(body()), 404, "not_found_error"),
        ("/v1/messages/nope", b"", 404, "not_found_error"),
        (MESSAGES, "x" * 2048, 413, "request_too_large"),
    ],
)
async def test_errors_have_anthropic_shape(
    path: str, content: str | bytes, status: int, kind: str
) -> None:
    app, engine, publisher = app_for(["never<|im_end|>"], Settings(max_request_bytes=1024))
    async with asgi_client(app) as client:
        response = await client.post(path, content=content)
    assert response.status_code == status
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert error["error"]["message"]
    assert publisher.events == [] and engine.prompts == []


async def test_broker_down_is_a_529_the_sdk_retries() -> None:
    app, _, publisher = app_for(["again<|im_end|>"] * 3)  # one reply per attempt
    publisher.fail_next = True
    async with asgi_client(app) as raw:
        response = await raw.post(MESSAGES, json=body())
    assert response.status_code == 529 and response.headers["retry-after"]
    assert response.json()["error"]["type"] == "overloaded_error"
    assert publisher.events == []

    publisher.fail_next = True  # as Claude Code does, the SDK retries a 529 and succeeds
    async with sdk(app, max_retries=1) as client:
        message = await client.messages.create(model="m", max_tokens=64, messages=ASK)
    [step] = publisher.steps()
    assert message.id == f"msg_{step.step_id}" and message.content[0].type == "text"


async def test_broker_down_mid_stream_is_an_error_event_without_message_stop() -> None:
    app, _, publisher = app_for(["streamed<|im_end|>"])
    publisher.fail_next = True
    async with asgi_client(app) as client:
        response = await client.post(MESSAGES, json=body(stream=True))
    events = sse_events(response.text)
    assert response.status_code == 200  # already sent when the publish failed
    assert events[0]["type"] == "message_start"
    assert events[-1] == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "broker down (scripted)"},
    }
    assert "message_stop" not in [e["type"] for e in events] and publisher.events == []


async def test_sdk_raises_on_an_error_event() -> None:
    app, _, publisher = app_for(["streamed<|im_end|>"])
    publisher.fail_next = True
    async with sdk(app) as client:
        stream = await client.messages.create(model="m", max_tokens=64, messages=ASK, stream=True)
        with pytest.raises(anthropic.APIStatusError) as failure:
            _ = [event async for event in stream]
    assert failure.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "broker down (scripted)"},
    }


async def test_refused_stream_gets_a_status_line() -> None:
    # Preparation errors surface before the first event, so they keep their HTTP status.
    app, _, publisher = app_for(["never<|im_end|>"])
    async with asgi_client(app) as client:
        response = await client.post(
            "/sess/s1/v1/messages",
            json=body(
                stream=True, max_tokens=1, messages=[{"role": "user", "content": "x " * 5000}]
            ),
        )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert publisher.events == []

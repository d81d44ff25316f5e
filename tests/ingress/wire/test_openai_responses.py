"""The OpenAI Responses adapter on the SCRIPTED ENGINE DOUBLE, through the official openai SDK
and raw SSE: items and events clients (Codex, openai-agents) read, echoed items continuing the
chain (TITO), a 200 only once the step is recorded, and typed 400s/503s in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from openai import APIStatusError, AsyncOpenAI, BadRequestError

from ingress.turns.turn import SessionRef
from ingress.wire import openai_responses
from ingress.wire.http import session_ref
from ingress.wire.openai_responses import parse_request
from tests.support.apps import asgi_client, scripted_app
from tests.support.doubles import RecordingPublisher
from titoflow.errors import InvalidRequest

CALL = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>'
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": False,
}
URL = "/sess/s1/v1/responses"


def app_for(replies: list[str]) -> tuple[FastAPI, RecordingPublisher]:
    app, _, publisher = scripted_app(replies, [openai_responses.router])
    return app, publisher


def sdk(app: FastAPI) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url="http://ingress/sess/s1/v1",
        api_key="k",
        http_client=asgi_client(app),
        max_retries=0,
    )


async def sse_events(app: FastAPI, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of a streamed response, checking each ``event:`` line names its data."""
    async with asgi_client(app) as client:
        response = await client.post(URL, json={**body, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {data['type']}"
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


async def test_plain_text_with_the_sdk() -> None:
    app, publisher = app_for(["Hello there<|im_end|>"])
    response = await sdk(app).responses.create(model="m", input="hi", instructions="Be brief.")

    [step] = publisher.steps()
    assert step.api == "openai.responses" and step.prefix == "rendered"
    assert [m["role"] for m in step.new_messages] == ["system", "user"]
    assert response.id == f"resp_{step.step_id}" and response.status == "completed"
    assert response.output_text == "Hello there"
    [message] = response.output
    assert message.type == "message" and message.id == f"msg_{step.step_id}_0"
    assert response.usage is not None
    assert response.usage.output_tokens == len(step.completion_ids)
    assert response.usage.input_tokens == step.prefix_len + len(step.prompt_tail_ids)
    assert response.instructions == "Be brief." and response.model == "m"


async def test_streamed_text_event_order_and_sdk_accumulation() -> None:
    app, publisher = app_for(["Hello there, friend<|im_end|>", "Hello there, friend<|im_end|>"])
    events = await sse_events(app, {"model": "m", "input": "hi"})
    names = [e["type"] for e in events]
    deltas = names.count("response.output_text.delta")
    assert deltas > 1  # streamed as the engine sampled, not in one piece
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    [step] = publisher.steps()
    final = events[-1]["response"]
    assert final["id"] == events[0]["response"]["id"] == f"resp_{step.step_id}"
    assert events[0]["response"]["status"] == "in_progress"
    assert final["output"] == [events[-2]["item"]]
    assert "".join(e["delta"] for e in events if "delta" in e) == "Hello there, friend"
    assert final["usage"]["output_tokens"] == len(step.completion_ids)

    # The SDK's stream helper checks item identities across events and rebuilds the response.
    # Same session, same conversation: another sample of the same prompt, with its own ids.
    async with sdk(app).responses.stream(model="m", input="hi") as stream:
        rebuilt = await stream.get_final_response()
    assert rebuilt.output_text == "Hello there, friend"
    again = rebuilt.model_dump(exclude_none=True)["output"]
    assert without_ids(again) == without_ids(final["output"])
    assert again[0]["id"] != final["output"][0]["id"]


async def test_a_qwen3_tool_call_becomes_a_function_call_item() -> None:
    app, publisher = app_for([CALL, CALL])
    response = await sdk(app).responses.create(model="m", input="list files", tools=[EXEC])  # type: ignore[list-item]
    [call] = response.output
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("exec_command", {"cmd": "ls"})
    [step] = publisher.steps()
    assert call.call_id == step.response_message["tool_calls"][0]["id"]
    assert call.id == f"fc_{step.step_id}_0" and call.status == "completed"

    events = await sse_events(app, {"model": "m", "input": "list files", "tools": [EXEC]})
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["item"]["status"] == "in_progress" and events[2]["item"]["arguments"] == ""
    streamed = events[-1]["response"]["output"]  # another sample: its own item and call ids
    assert without_ids(streamed) == without_ids([call.model_dump(exclude_none=True)])
    assert streamed[0]["call_id"] != call.call_id


async def test_reasoning_is_a_summary_item_before_the_message() -> None:
    reply = "<think>\nplan\n</think>\n\nHello<|im_end|>"
    app, _ = app_for([reply, reply])
    response = await sdk(app).responses.create(model="m", input="hi")
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and [s.text for s in reasoning.summary] == ["plan"]
    assert message.type == "message" and response.output_text == "Hello"

    events = await sse_events(app, {"model": "m", "input": "hi"})
    names = [e["type"] for e in events if not e["type"].endswith(".delta")]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert without_ids(events[-1]["response"]["output"]) == without_ids(
        [item.model_dump(exclude_none=True) for item in response.output]
    )


def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items less the ids that name their sample (two samples never share them)."""
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


async def streamed_items(client: AsyncOpenAI, **request: Any) -> list[dict[str, Any]]:
    """The output items as Codex keeps them: from response.output_item.done, in order."""
    stream = await client.responses.create(stream=True, **request)
    done: list[dict[str, Any]] = []
    async for event in stream:
        if event.type == "response.output_item.done":
            done.append(event.item.model_dump(exclude_none=True))
        assert event.type != "error"
    return done


async def test_echoed_items_continue_the_chain_as_codex_does() -> None:
    reply = "<think>\nlook first\n</think>\n\nLet me look." + CALL
    app, publisher = app_for([reply, "There is a.txt.<|im_end|>"])
    client = sdk(app)
    conversation: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sh"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls?"}]},
    ]
    first = await streamed_items(client, model="m", input=conversation, tools=[EXEC])
    assert [item["type"] for item in first] == ["reasoning", "message", "function_call"]
    conversation += first
    conversation.append(
        {"type": "function_call_output", "call_id": first[2]["call_id"], "output": "a.txt"}
    )
    second = await streamed_items(client, model="m", input=conversation, tools=[EXEC])
    assert second[0]["content"][0]["text"] == "There is a.txt."

    one, two = publisher.steps()
    assert (one.prefix, two.prefix) == ("rendered", "tito")
    assert two.parent_step_id == one.step_id and two.chain_id == one.chain_id
    # Only the tool result is new: the echoed items folded back into the recorded turn.
    assert [m["role"] for m in two.new_messages] == ["tool"]
    assert one.response_message["content"] == "Let me look."


def test_items_of_one_response_fold_into_one_assistant_turn() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"}
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        call,
        {**call, "call_id": "c2"},
        {"type": "message", "role": "assistant", "content": "b"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "x"}],
        },
        {**call, "call_id": "c3"},  # a call with no message before it starts a turn
    ]
    turn, _ = parse_request({"model": "m", "input": items}, SessionRef(session_id="s"))
    user, answer, result, alone = turn.messages
    assert (user.role, user.content) == ("user", "go")
    assert (answer.role, answer.content, answer.reasoning) == ("assistant", "ab", "plan")
    assert [c.id for c in answer.tool_calls] == ["c1", "c2"]
    assert (result.role, result.content, result.tool_call_id) == ("tool", "x", "c1")
    assert (alone.content, [c.id for c in alone.tool_calls]) == ("", ["c3"])


async def test_a_codex_shaped_body_is_accepted() -> None:
    app, publisher = app_for(["ok<|im_end|>"])
    body = {
        "model": "m",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are Codex."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
        "tools": [
            EXEC,
            {"type": "web_search", "external_web_access": False},
            {
                "type": "namespace",
                "name": "multi_agent",
                "tools": [{"type": "function", "name": "x"}],
            },
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "client_metadata": {"x": "y"},
        "text": {"verbosity": "low"},
    }
    headers = {"originator": "codex_exec", "session-id": "t", "accept": "text/event-stream"}
    async with asgi_client(app) as client:
        response = await client.post(URL, json=body, headers=headers)
    assert response.status_code == 200
    assert "event: response.completed" in response.text
    [step] = publisher.steps()
    assert step.new_messages[0] == {"role": "system", "content": "You are Codex."}
    turn, _ = parse_request(body, SessionRef(session_id="s"))
    assert turn.tools == (
        {
            "type": "function",
            "function": {
                "name": "exec_command",
                "description": "Run a shell command.",
                "parameters": EXEC["parameters"],
            },
        },
    )


def test_tool_choice_forms() -> None:
    def choice(value: object) -> tuple[str, str | None]:
        turn, _ = parse_request(
            {"model": "m", "input": "x", "tool_choice": value}, SessionRef(session_id="s")
        )
        return turn.tool_choice, turn.tool_choice_name

    assert choice("required") == ("required", None)
    assert choice({"type": "function", "name": "exec_command"}) == ("named", "exec_command")


async def test_previous_response_id_is_refused_with_a_clear_400() -> None:
    app, publisher = app_for([])
    with pytest.raises(BadRequestError) as failure:
        await sdk(app).responses.create(model="m", input="hi", previous_response_id="resp_1")
    error = failure.value.body
    assert isinstance(error, dict)
    assert error["param"] == "previous_response_id" and "full conversation" in error["message"]
    assert publisher.events == []


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": ["text"]}, "input.0"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        (
            {
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}],
            },
            "input.0.content",
        ),
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "input.0.call_id"),
        ({"model": "m", "input": [{"type": "computer_call_output"}]}, "input.0.type"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
        ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools.0.name"),
        ({"model": "m", "input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, "conversation"),
    ],
)
def test_invalid_requests_are_typed_400s(bad: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as failure:
        parse_request(bad, SessionRef(session_id="s"))
    assert (failure.value.param or "").startswith(param)


async def test_malformed_input_gets_an_openai_shaped_400() -> None:
    app, publisher = app_for([])
    async with asgi_client(app) as client:
        response = await client.post(
            URL, json={"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}
        )
        not_json = await client.post(
            URL, content=b"{", headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "input.0.call_id"
    assert not_json.status_code == 400 and not_json.json()["error"]["message"]
    assert publisher.events == []


async def test_a_truncated_response_is_incomplete() -> None:
    words = "one two three four five six seven eight"
    app, _ = app_for([words, words])
    response = await sdk(app).responses.create(model="m", input="count", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    events = await sse_events(app, {"model": "m", "input": "count", "max_output_tokens": 3})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_broker_down_is_a_retryable_503_and_nothing_is_recorded() -> None:
    app, publisher = app_for(["Hello<|im_end|>", "Hello<|im_end|>"])
    publisher.fail_next = True
    with pytest.raises(APIStatusError) as failure:
        await sdk(app).responses.create(model="m", input="hi")
    assert failure.value.status_code == 503
    assert failure.value.response.headers["retry-after"]
    assert failure.value.response.json()["error"]["code"] == "broker_unavailable"
    assert publisher.events == []

    # Streaming: the text already went out, but no response.completed without a durable step.
    publisher.fail_next = True
    events = await sse_events(app, {"model": "m", "input": "hi"})
    assert events[-1]["type"] == "error" and events[-1]["code"] == "broker_unavailable"
    assert "response.completed" not in [e["type"] for e in events]
    assert publisher.events == []


async def test_the_sdk_surfaces_a_stream_error_event() -> None:
    app, publisher = app_for(["Hello<|im_end|>"])
    publisher.fail_next = True
    stream = await sdk(app).responses.create(model="m", input="hi", stream=True)
    kinds = [event.type async for event in stream]
    assert kinds[-1] == "error" and "response.completed" not in kinds


async def test_the_service_refusing_a_stream_still_gets_a_status_line() -> None:
    app, publisher = app_for([])
    body = {
        "model": "m",
        "input": "x",
        "tools": [EXEC],
        "tool_choice": {"type": "function", "name": "nope"},
    }
    async with asgi_client(app) as client:
        response = await client.post(URL, json={**body, "stream": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice"
    assert publisher.events == []


def test_unused_fields_are_not_errors() -> None:
    body = {
        "model": "m",
        "input": "x",
        "store": True,  # accepted; nothing is stored
        "reasoning": {"effort": "high", "summary": "detailed"},
        "include": ["reasoning.encrypted_content"],
        "text": {"format": {"type": "text"}},
        "metadata": {"session_id": "from-body"},
        "temperature": 0.5,
        "top_p": 0.9,
    }
    turn, _ = parse_request(body, session_ref(None, {}, body))
    assert turn.session.session_id == "from-body" and turn.api == "openai.responses"
    assert (turn.sampling.temperature, turn.sampling.top_p) == (0.5, 0.9)


async def test_the_plain_route_takes_the_session_from_a_header() -> None:
    app, publisher = app_for(["Hi<|im_end|>"])
    async with asgi_client(app) as client:
        response = await client.post(
            "/v1/responses", json={"model": "m", "input": "hi"}, headers={"x-session-id": "h1"}
        )
    assert response.status_code == 200
    assert publisher.steps()[0].session_id == "h1"

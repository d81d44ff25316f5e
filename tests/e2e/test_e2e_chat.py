"""OpenAI chat on the real stack (vLLM CPU, tansu, worker): streaming and not, with tools forced
by the engine's own constrained decoding, over a multi-turn tool loop. Asserts what the client
saw against the recorded steps: exact ids, one step per call, chain reuse."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from cli.dev.stack import start_ingress, start_worker
from tests.support.families import path_tool
from tests.support.topics import finalized_segments, recorded_steps
from titoflow.settings import Settings
from titoflow.tito.tokenizer import load_tokenizer

pytestmark = pytest.mark.engine

TOOLS: Any = [path_tool("ls", "list a directory"), path_tool("cat", "print a file")]


async def test_tool_loop_streaming_and_not_matches_the_recorded_steps(
    stack_settings: Settings, tmp_path: Path
) -> None:
    ingress, url = start_ingress(stack_settings, tmp_path)
    worker = start_worker(stack_settings, tmp_path)
    session = f"chat-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": "What is in /tmp?"},
    ]
    seen: list[dict[str, Any]] = []
    try:
        # Turn 1, not streamed: the engine is constrained to call `ls`.
        first = await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "ls"}},
            max_tokens=64,
            seed=7,
        )
        [call] = first.choices[0].message.tool_calls or []
        assert isinstance(call, ChatCompletionMessageFunctionToolCall)
        assert call.function.name == "ls" and first.choices[0].finish_reason == "tool_calls"
        seen.append({"calls": [call.model_dump()], "content": first.choices[0].message.content})
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "notes.txt"},
        ]
        # Turn 2, streamed: any tool must be called.
        stream = await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=64,
            seed=8,
            stream=True,
        )
        streamed = [
            tc
            async for chunk in stream
            if chunk.choices
            for tc in chunk.choices[0].delta.tool_calls or []
        ]
        [second_call] = streamed
        assert second_call.function is not None and second_call.function.name in {"ls", "cat"}
        calls = [
            {
                "id": second_call.id,
                "type": "function",
                "function": second_call.function.model_dump(),
            }
        ]
        seen.append({"calls": calls, "content": None})
        messages += [
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": second_call.id, "content": "hello"},
        ]
        # Turn 3, streamed, free text.
        stream = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=16, seed=9, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        seen.append({"calls": [], "content": text})
        segments = await finalized_segments(stack_settings, url, session)
    finally:
        await client.close()
        ingress.stop()
        worker.stop()

    steps = await recorded_steps(stack_settings, session, 3)
    assert len(steps) == 3  # one step per call
    assert [s.stream for s in steps] == [False, True, True]
    assert [s.prefix for s in steps] == ["rendered", "tito", "tito"]
    assert [s.parent_step_id for s in steps] == [None, steps[0].step_id, steps[1].step_id]
    tokenizer = load_tokenizer(stack_settings.model_path)
    for step, client_view in zip(steps, seen, strict=True):
        recorded_calls = step.response_message.get("tool_calls", [])
        assert [c["id"] for c in recorded_calls] == [c["id"] for c in client_view["calls"]]
        assert [c["function"]["name"] for c in recorded_calls] == [
            c["function"]["name"] for c in client_view["calls"]
        ]
        for recorded, shown in zip(recorded_calls, client_view["calls"], strict=True):
            assert recorded["function"]["arguments"] == json.loads(shown["function"]["arguments"])
        text = tokenizer.decode(step.completion_ids, skip_special_tokens=True)
        if recorded_calls:  # the sampled tokens are the tool call the client got
            assert text.startswith("<tool_call>") and recorded_calls[0]["function"]["name"] in text
        else:
            assert client_view["content"] == step.response_message["content"]
    [segment] = [s for s in segments if s.session_id == session]
    assert [s.step_id for s in segment.steps] == [s.step_id for s in steps]

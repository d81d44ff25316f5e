"""Anthropic messages on the real stack (vLLM CPU, tansu, worker), driven by the anthropic SDK:
streamed and not, over multi-turn conversations with tools whose assistant turns are echoed
back. Asserts what the client saw against the recorded steps: one step per call, the same
ids, text, reasoning and tool calls, and turns after the first reusing the chain (TITO)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import Message, MessageParam, ToolParam

from cli.dev.stack import start_ingress, start_worker
from schemas.events import StepRecorded
from tests.support.topics import finalized_segments, recorded_steps
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

# An enum keeps a forced call short on a tiny random model, so it closes within max_tokens.
BASH: ToolParam = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string", "enum": ["ls", "pwd"]}},
        "required": ["command"],
    },
}
QUESTIONS = ["List the files in /tmp.", "Which one is largest?", "Delete it."]


def client_for(url: str, session: str) -> anthropic.AsyncAnthropic:
    # As Claude Code and the SDKs are configured: the session base URL, without /v1.
    return anthropic.AsyncAnthropic(base_url=f"{url}/sess/{session}", api_key="k", max_retries=0)


async def ask(
    client: anthropic.AsyncAnthropic, stream: bool, max_tokens: int, **request: Any
) -> Message:
    if not stream:
        created: Message = await client.messages.create(
            model="policy", max_tokens=max_tokens, **request
        )
        return created
    async with client.messages.stream(model="policy", max_tokens=max_tokens, **request) as events:
        return await events.get_final_message()


def client_view(message: Message) -> dict[str, Any]:
    thinking = [b.thinking for b in message.content if b.type == "thinking"]
    return {
        "id": message.id,
        "text": "".join(b.text for b in message.content if b.type == "text"),
        "reasoning": "".join(thinking) or None,
        "calls": [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"],
        "usage": (message.usage.input_tokens, message.usage.output_tokens),
    }


def recorded_view(step: StepRecorded) -> dict[str, Any]:
    answer = step.response_message
    calls = answer.get("tool_calls", [])
    return {
        "id": f"msg_{step.step_id}",
        "text": answer["content"],
        "reasoning": answer.get("reasoning_content") or None,
        "calls": [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls],
        "usage": (step.prefix_len + len(step.prompt_tail_ids), len(step.completion_ids)),
    }


@pytest.mark.parametrize("streams", [(False, True, True), (True, False, True)])
async def test_three_turns_with_tools_match_the_recorded_steps(
    stack_settings: Settings, tmp_path: Path, streams: tuple[bool, ...]
) -> None:
    ingress, url = start_ingress(stack_settings, tmp_path)
    worker = start_worker(stack_settings, tmp_path)
    session = f"anth-{uuid.uuid4().hex[:8]}"
    client = client_for(url, session)
    messages: list[MessageParam] = []
    seen: list[Message] = []
    try:
        for question, stream in zip(QUESTIONS, streams, strict=True):
            messages.append({"role": "user", "content": question})
            message = await ask(
                client, stream, 24, system="You are a shell agent.", messages=messages, tools=[BASH]
            )
            seen.append(message)
            messages.append({"role": "assistant", "content": message.content})  # echoed back
        segments = await finalized_segments(stack_settings, url, session)
    finally:
        await client.close()
        ingress.stop()
        worker.stop()

    steps = await recorded_steps(stack_settings, session, len(QUESTIONS))
    assert len(steps) == len(QUESTIONS)  # one step per call
    assert [s.api for s in steps] == ["anthropic.messages"] * 3
    assert tuple(s.stream for s in steps) == streams
    assert [s.prefix for s in steps] == ["rendered", "tito", "tito"]
    assert [s.parent_step_id for s in steps] == [None, steps[0].step_id, steps[1].step_id]
    for step, message in zip(steps, seen, strict=True):
        assert client_view(message) == recorded_view(step)
    [segment] = [s for s in segments if s.session_id == session]
    assert [s.step_id for s in segment.steps] == [s.step_id for s in steps]


async def test_named_tool_choice_forces_a_tool_use_block(
    stack_settings: Settings, tmp_path: Path
) -> None:
    ingress, url = start_ingress(stack_settings, tmp_path)
    session = f"anth-tool-{uuid.uuid4().hex[:8]}"
    client = client_for(url, session)
    messages: list[MessageParam] = [{"role": "user", "content": "What is in /tmp?"}]
    try:
        forced = await ask(
            client,
            False,
            128,
            messages=messages,
            tools=[BASH],
            tool_choice={"type": "tool", "name": "Bash"},
        )
        [call] = [b for b in forced.content if b.type == "tool_use"]
        assert forced.stop_reason == "tool_use" and call.name == "Bash"
        assert call.id.startswith("toolu_") and call.input in (
            {"command": "ls"},
            {"command": "pwd"},
        )
        messages += [
            {"role": "assistant", "content": forced.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt"}],
            },
        ]
        answer = await ask(client, True, 16, messages=messages, tools=[BASH])
    finally:
        await client.close()
        ingress.stop()

    first, second = await recorded_steps(stack_settings, session, 2)
    assert client_view(forced) == recorded_view(first)
    assert client_view(answer) == recorded_view(second)
    assert second.prefix == "tito" and second.parent_step_id == first.step_id
    assert second.new_messages[0] == {"role": "tool", "content": "a.txt", "tool_call_id": call.id}

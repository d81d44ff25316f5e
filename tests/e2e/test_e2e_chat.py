"""OpenAI chat on the real stack (vLLM CPU, tansu, worker): streaming and not, with tools forced
by the engine's own constrained decoding, over a multi-turn tool loop. Asserts what the client
saw against the recorded steps: exact ids, one step per call, chain reuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.families import path_tool
from tests.support.sessions import session_on_stack
from tests.support.tool_loop import tool_loop
from tests.support.topics import finalized_segments, recorded_steps
from titoflow.settings import Settings
from titoflow.tito.tokenizer import load_tokenizer

pytestmark = pytest.mark.engine

TOOLS: Any = [path_tool("ls", "list a directory"), path_tool("cat", "print a file")]


async def test_tool_loop_streaming_and_not_matches_the_recorded_steps(
    stack_settings: Settings, tmp_path: Path
) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": "What is in /tmp?"},
    ]
    async with session_on_stack(stack_settings, tmp_path, "chat") as (url, session, client):
        seen = await tool_loop(client, messages, TOOLS, max_tokens=64)
        segments = await finalized_segments(stack_settings, url, session)

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

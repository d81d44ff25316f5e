"""End to end on real parts: openai SDK (Responses API) → ingress → real vLLM (CPU) → tansu →
worker → segment.

A three-turn conversation with a function tool, streamed and not, where every turn's output items
are echoed back as input items (as Codex does with ``store: false``). Invariants exercised: what
the client sees is what the step recorded; one step per call, chained by TITO (the echoed items
fold back into the recorded turn); a named ``tool_choice`` forces a function call (constrained
decoding); the segment is those exact tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response

from schemas.events import StepRecorded
from tests.support.sessions import session_on_stack
from tests.support.topics import finalized_segments, recorded_steps
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

MODEL = "titoflow-policy"
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command.",
    # An enum keeps a forced call short, whatever the tiny random model prefers.
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string", "enum": ["ls", "du", "rm"]}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
    "strict": True,
}
FORCED = {"type": "function", "name": "exec_command"}


async def respond(client: AsyncOpenAI, stream: bool, **request: Any) -> Response:
    """The final response object; streamed, it must equal the items the events delivered."""
    if not stream:
        response: Response = await client.responses.create(**request)
        return response
    done: list[dict[str, Any]] = []
    final: Response | None = None
    async for event in await client.responses.create(stream=True, **request):
        assert event.type != "error", event
        if event.type == "response.output_item.done":
            done.append(event.item.model_dump(exclude_none=True))
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert final is not None
    assert [item.model_dump(exclude_none=True) for item in final.output] == done
    return final


def visible(response: Response) -> dict[str, Any]:
    """What a client reads from the output items, in the shape steps record it."""
    texts = [
        c.text
        for i in response.output
        if i.type == "message"
        for c in i.content
        if c.type == "output_text"
    ]
    summaries = [s.text for i in response.output if i.type == "reasoning" for s in i.summary]
    calls = [
        (i.call_id, i.name, json.loads(i.arguments))
        for i in response.output
        if i.type == "function_call"
    ]
    return {"content": "".join(texts), "reasoning": "".join(summaries), "calls": calls}


def recorded(step: StepRecorded) -> dict[str, Any]:
    message = step.response_message
    calls = [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls", [])
    ]
    return {
        "content": message["content"],
        "reasoning": message.get("reasoning_content") or "",
        "calls": calls,
    }


async def test_three_responses_turns_echoed_as_items_are_one_tito_chain(
    stack_settings: Settings, tmp_path: Path
) -> None:
    conversation: list[dict[str, Any]] = [
        {"role": "developer", "content": [{"type": "input_text", "text": "You are a shell agent."}]}
    ]
    plan = [  # (question, stream, tool_choice)
        ("List the files in /tmp.", False, FORCED),
        (None, True, "auto"),  # answers the tool result
        ("Now delete the largest one.", True, FORCED),
    ]
    responses: list[Response] = []
    async with session_on_stack(stack_settings, tmp_path, "resp") as (url, session, client):
        for question, stream, choice in plan:
            if question:
                conversation.append({"role": "user", "content": question})
            response = await respond(
                client,
                stream,
                model=MODEL,
                input=conversation,
                tools=[EXEC],
                tool_choice=choice,
                max_output_tokens=48,
                store=False,
                include=["reasoning.encrypted_content"],
            )
            responses.append(response)
            items = [item.model_dump(exclude_none=True) for item in response.output]
            conversation += items  # echoed, as Codex does
            conversation += [
                {"type": "function_call_output", "call_id": i["call_id"], "output": "a.txt b.log"}
                for i in items
                if i["type"] == "function_call"
            ]
        segments = await finalized_segments(stack_settings, url, session)

    steps = await recorded_steps(stack_settings, session, 3)

    # One step per call, each extending the last by TITO: the echoed items matched the record.
    assert [s.api for s in steps] == ["openai.responses"] * 3
    assert [s.stream for s in steps] == [False, True, True]
    assert [s.prefix for s in steps] == ["rendered", "tito", "tito"]
    assert [s.parent_step_id for s in steps] == [None, steps[0].step_id, steps[1].step_id]

    for response, step in zip(responses, steps, strict=True):
        assert response.id == f"resp_{step.step_id}"
        assert visible(response) == recorded(step)
        assert response.status == ("incomplete" if step.finish_reason == "length" else "completed")
        assert response.usage is not None
        assert response.usage.output_tokens == len(step.completion_ids)
        assert response.usage.input_tokens == step.prefix_len + len(step.prompt_tail_ids)

    # A named tool_choice forces a call of that tool, streamed or not.
    for forced in (responses[0], responses[2]):
        [call] = [i for i in forced.output if i.type == "function_call"]
        assert call.name == "exec_command"
        assert json.loads(call.arguments)["cmd"] in {"ls", "du", "rm"}

    # The segment is the exact tokens of the three steps, in order.
    [segment] = [s for s in segments if s.session_id == session]
    assert [s.step_id for s in segment.steps] == [s.step_id for s in steps]
    sent: list[int] = []
    for step in steps:
        assert step.prefix_len == len(sent)
        sent += step.prompt_tail_ids + step.completion_ids
    assert segment.token_ids == sent

"""The linear tool loop the end-to-end chat tests drive through the ingress with the OpenAI SDK:
turn 1 not streamed, the call to ``ls`` forced (the engine's constrained decoding); turn 2
streamed, some tool required; turn 3 streamed, free text. Each turn's request carries the
results of the one before. What the client saw of each turn comes back, for the tests to hold
against the recorded steps."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageFunctionToolCall


async def tool_loop(
    client: AsyncOpenAI, messages: list[Any], tools: Any, max_tokens: int
) -> list[dict[str, Any]]:
    """Per turn, the calls the client got (as the SDK dumps them) and the content; the two
    calls' turns are given ``max_tokens``."""
    messages = list(messages)
    first = await client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "ls"}},
        max_tokens=max_tokens,
        seed=7,
    )
    [call] = first.choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "ls" and first.choices[0].finish_reason == "tool_calls"
    seen: list[dict[str, Any]] = [
        {"calls": [call.model_dump()], "content": first.choices[0].message.content}
    ]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "notes.txt"},
    ]
    stream = await client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=tools,
        tool_choice="required",
        max_tokens=max_tokens,
        seed=8,
        stream=True,
    )
    streamed = [
        tc
        async for chunk in stream
        if chunk.choices
        for tc in chunk.choices[0].delta.tool_calls or []
    ]
    [second] = streamed
    assert second.function is not None and second.function.name in {"ls", "cat"}
    calls = [{"id": second.id, "type": "function", "function": second.function.model_dump()}]
    seen.append({"calls": calls, "content": None})
    messages += [
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": second.id, "content": "hello"},
    ]
    stream = await client.chat.completions.create(
        model="policy", messages=messages, tools=tools, max_tokens=16, seed=9, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    seen.append({"calls": [], "content": text})
    return seen

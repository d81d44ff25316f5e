"""The ingress core (ChatService) on a scripted engine double: chain reuse, step ids, parsing,
and the durability rule (nothing cached unless published)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ingress.chains import ChainStore
from ingress.service import ChatService, ServiceOptions
from ingress.turn import ChatTurn, SamplingOptions, SessionRef
from schemas.events import StepRecorded
from tests.doubles import RecordingPublisher, ScriptedEngine
from tests.families import path_tool, qwen3
from titoflow.errors import ContextOverflow, PublishFailed
from titoflow.tito.messages import Matcher, Message, ToolCall
from titoflow.tito.render import ChatRenderer

TOOLS = (path_tool("ls", "list a directory"),)


def make_service(
    replies: list[str], max_model_len: int = 4096, matcher: Matcher = "strict"
) -> tuple[ChatService, ScriptedEngine, RecordingPublisher]:
    tokenizer = qwen3()
    engine = ScriptedEngine(tokenizer, replies)
    publisher = RecordingPublisher()
    service = ChatService(
        renderer=ChatRenderer(tokenizer),
        tokenizer=tokenizer,
        engine=engine,
        publish=publisher,
        chains=ChainStore(100),
        options=ServiceOptions(max_model_len=max_model_len, default_max_tokens=64, matcher=matcher),
    )
    return service, engine, publisher


def turn(
    messages: list[Message], session: str = "s1", tools: tuple[dict[str, Any], ...] = ()
) -> ChatTurn:
    return ChatTurn(
        session=SessionRef(session_id=session),
        api="openai.chat",
        model="m",
        messages=tuple(messages),
        tools=tools,
        sampling=SamplingOptions(),
    )


async def test_turns_reuse_the_exact_tokens_already_sent() -> None:
    service, engine, publisher = make_service(
        ["<think>\nplan\n</think>\n\nHello there<|im_end|>", "Second answer<|im_end|>"]
    )
    history = [Message(role="system", content="sys"), Message(role="user", content="hi")]
    first = await service.complete(turn(history))
    assert first.step.prefix == "rendered" and first.step.parent_step_id is None
    assert first.parsed.reasoning == "plan" and first.parsed.content == "Hello there"

    # The scaffold echoes the parsed reply (without reasoning) and asks again.
    history += [
        Message(role="assistant", content="Hello there"),
        Message(role="user", content="more"),
    ]
    second = await service.complete(turn(history))

    assert second.step.prefix == "tito"
    assert second.step.parent_step_id == first.step.step_id
    assert second.step.chain_id == first.step.step_id
    sent_before = engine.prompts[0] + first.step.completion_ids
    assert second.step.prefix_len == len(sent_before)
    assert engine.prompts[1] == sent_before + second.step.prompt_tail_ids
    # The sampled <think> block stays in the prompt although the template would drop it.
    assert "<think>\nplan\n</think>" in qwen3().decode(engine.prompts[1])
    assert [type(e) for e in publisher.events] == [StepRecorded, StepRecorded]


async def test_tool_calls_are_parsed_with_deterministic_ids_and_continue_the_chain() -> None:
    reply = '<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp"}}\n</tool_call><|im_end|>'
    service, _, _ = make_service([reply, "done<|im_end|>"])
    history = [Message(role="user", content="list /tmp")]
    first = await service.complete(turn(history, tools=TOOLS))
    [call] = first.parsed.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("ls", {"path": "/tmp"})
    assert first.step.tool_parse_error is None

    echoed = ToolCall(id=call.id, name="ls", arguments='{"path":"/tmp"}')  # re-serialized args
    history += [
        Message(role="assistant", content="", tool_calls=(echoed,)),
        Message(role="tool", content="a.txt", tool_call_id=call.id),
    ]
    second = await service.complete(turn(history, tools=TOOLS))
    assert second.step.prefix == "tito"
    assert second.step.parent_step_id == first.step.step_id

    # The same prompt sampled again is another sample: its own step id and tool-call ids.
    again, _, _ = make_service([reply])
    resampled = await again.complete(turn(history[:1], tools=TOOLS))
    assert resampled.step.step_id != first.step.step_id
    assert resampled.parsed.tool_calls[0].id != call.id


async def test_malformed_tool_call_is_returned_as_text_and_recorded() -> None:
    bad = '<tool_call>\n{"name": "ls", "arguments": {"path": }\n</tool_call><|im_end|>'
    service, _, _ = make_service([bad])
    counted = REGISTRY.get_sample_value(
        "titoflow_ingress_tool_parse_errors_total", {"api": "openai.chat"}
    )
    result = await service.complete(turn([Message(role="user", content="x")], tools=TOOLS))
    assert result.parsed.tool_calls == []
    assert "<tool_call>" in result.parsed.content
    assert result.step.tool_parse_error
    await asyncio.sleep(0)  # metrics are counted on the loop's next turn, after the answer
    assert (
        REGISTRY.get_sample_value(
            "titoflow_ingress_tool_parse_errors_total", {"api": "openai.chat"}
        )
        == (counted or 0) + 1
    )


async def test_changed_tools_start_a_new_chain() -> None:
    service, _, _ = make_service(["a<|im_end|>", "b<|im_end|>"])
    history = [Message(role="user", content="x")]
    await service.complete(turn(history))
    history += [Message(role="assistant", content="a"), Message(role="user", content="y")]
    second = await service.complete(turn(history, tools=TOOLS))
    assert second.step.prefix == "rendered"


async def test_a_failed_publish_leaves_the_chain_as_it_was() -> None:
    service, engine, publisher = make_service(["a<|im_end|>", "b<|im_end|>", "c<|im_end|>"])
    history = [Message(role="user", content="x")]
    first = await service.complete(turn(history))
    history += [Message(role="assistant", content="a"), Message(role="user", content="y")]
    publisher.fail_next = True
    with pytest.raises(PublishFailed):
        await service.complete(turn(history))
    retried = await service.complete(turn(history))
    assert retried.step.parent_step_id == first.step.step_id
    assert engine.prompts[1] == engine.prompts[2]
    assert len(publisher.events) == 2


async def test_length_cut_reply_is_closed_before_the_next_turn() -> None:
    service, _, _ = make_service(["word " * 100, "ok<|im_end|>"])
    history = [Message(role="user", content="x")]
    first = await service.complete(turn(history))
    assert first.step.finish_reason == "length"
    history += [
        Message(role="assistant", content=first.parsed.content),
        Message(role="user", content="y"),
    ]
    second = await service.complete(turn(history))
    assert second.step.prefix == "tito"
    assert second.step.prompt_tail_ids[0] == ChatRenderer(qwen3()).terminator_id


async def test_prompt_beyond_the_context_window_is_refused() -> None:
    service, _, publisher = make_service(["a"], max_model_len=8)
    with pytest.raises(ContextOverflow):
        await service.complete(turn([Message(role="user", content="a long question " * 4)]))
    assert publisher.events == []


@pytest.mark.parametrize(("matcher", "prefix"), [("strict", "rendered"), ("tool_call_id", "tito")])
async def test_claude_code_style_echo_matches_only_when_anchored_on_call_ids(
    matcher: Matcher, prefix: str
) -> None:
    """Claude Code renames tools (Task → Agent) and re-serializes arguments when it echoes a
    tool call back; anchoring on call ids keeps the chain, strict matching cannot."""
    reply = '<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp", "all": true}}\n</tool_call>'
    service, _, _ = make_service([reply + "<|im_end|>", "ok<|im_end|>"], matcher=matcher)
    history = [Message(role="user", content="list")]
    first = await service.complete(turn(history, tools=TOOLS))
    [call] = first.parsed.tool_calls
    rewritten = ToolCall(id=call.id, name="ls_v2", arguments='{"all":true,"path":"/tmp/"}')
    history += [
        Message(role="assistant", content="", tool_calls=(rewritten,)),
        Message(role="tool", content="a.txt", tool_call_id=call.id),
    ]
    second = await service.complete(turn(history, tools=TOOLS))
    assert second.step.prefix == prefix and second.step.matcher == matcher


async def test_max_tokens_cap_bounds_what_scaffolds_ask_for() -> None:
    tokenizer = qwen3()
    engine = ScriptedEngine(tokenizer, ["one two three four five six"])
    service = ChatService(
        renderer=ChatRenderer(tokenizer),
        tokenizer=tokenizer,
        engine=engine,
        publish=RecordingPublisher(),
        chains=ChainStore(10),
        options=ServiceOptions(max_model_len=4096, default_max_tokens=64, max_tokens_cap=3),
    )
    asked = turn([Message(role="user", content="x")]).model_copy(
        update={"sampling": SamplingOptions(max_tokens=32_000)}
    )
    result = await service.complete(asked)
    assert len(result.step.completion_ids) == 3 and result.step.finish_reason == "length"


async def test_two_samples_of_one_prompt_each_continue_the_one_the_client_echoes() -> None:
    replies = ["hi<|im_end|>", "A<|im_end|>", "B<|im_end|>", "B<|im_end|>"]
    replies += ["after A<|im_end|>", "after B<|im_end|>", "after twin<|im_end|>"]
    service, engine, _ = make_service(replies)
    start = [Message(role="user", content="q")]
    first = await service.complete(turn(start))
    ask = [*start, Message(role="assistant", content="hi"), Message(role="user", content="go")]
    a = await service.complete(turn(ask))  # the head's prompt...
    b = await service.complete(turn(ask))  # ...sampled again: TITO from the step before
    twin = await service.complete(turn(ask))  # the same answer as b: same tokens
    assert len({a.step.step_id, b.step.step_id, twin.step.step_id}) == 3
    for sample in (a, b, twin):
        assert sample.step.prefix == "tito" and sample.step.parent_step_id == first.step.step_id
    assert engine.prompts[1] == engine.prompts[2] == engine.prompts[3]

    def then(answer: str) -> list[Message]:
        return [*ask, Message(role="assistant", content=answer), Message(role="user", content="ok")]

    after_a = await service.complete(turn(then("A")))
    after_b = await service.complete(turn(then("B")))
    assert after_a.step.parent_step_id == a.step.step_id
    # b and its twin match alike: the one recorded first is continued (either is exact).
    assert after_b.step.parent_step_id == b.step.step_id
    assert engine.prompts[5][: len(engine.prompts[2]) + 2] == engine.prompts[2] + list(
        b.step.completion_ids
    )
    again = await service.complete(turn(then("B")))
    assert again.step.parent_step_id == b.step.step_id  # a second sample after b, by TITO

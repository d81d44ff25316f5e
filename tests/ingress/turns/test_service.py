"""The ingress core (ChatService) on a scripted engine double: chain reuse, step ids, parsing,
the durability rule (nothing cached unless published), white-box calls on the chat turns' step
path, and admission refusals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ingress.turns.admission import Control
from ingress.turns.chains import ChainStore
from ingress.turns.service import ChatService, ServiceOptions
from ingress.turns.turn import ChatTurn, SamplingOptions, SessionRef, TokenCall
from schemas.events import SessionEnded, SessionFinalized, SessionOptions, StepRecorded
from tests.support.doubles import RecordingPublisher, ScriptedEngine
from tests.support.families import path_tool, qwen3
from titoflow.errors import (
    ContextOverflow,
    PublishFailed,
    SessionAlreadyEnded,
    SessionStepLimit,
    TrajectoryVersionChanged,
)
from titoflow.tito.messages import Matcher, Message, ToolCall
from titoflow.tito.render import ChatRenderer

TOOLS = (path_tool("ls", "list a directory"),)


def make_service(
    replies: list[str],
    max_model_len: int = 4096,
    matcher: Matcher = "strict",
    control: Control | None = None,
    **limits: Any,
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
        options=ServiceOptions(
            max_model_len=max_model_len, default_max_tokens=64, matcher=matcher, **limits
        ),
        control=control,
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
    [first] = await service.complete(turn(history))
    assert first.step.prefix == "rendered" and first.step.parent_step_id is None
    assert first.parsed.reasoning == "plan" and first.parsed.content == "Hello there"

    # The scaffold echoes the parsed reply (without reasoning) and asks again.
    history += [
        Message(role="assistant", content="Hello there"),
        Message(role="user", content="more"),
    ]
    [second] = await service.complete(turn(history))

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
    [first] = await service.complete(turn(history, tools=TOOLS))
    [call] = first.parsed.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("ls", {"path": "/tmp"})
    assert first.step.tool_parse_error is None

    echoed = ToolCall(id=call.id, name="ls", arguments='{"path":"/tmp"}')  # re-serialized args
    history += [
        Message(role="assistant", content="", tool_calls=(echoed,)),
        Message(role="tool", content="a.txt", tool_call_id=call.id),
    ]
    [second] = await service.complete(turn(history, tools=TOOLS))
    assert second.step.prefix == "tito"
    assert second.step.parent_step_id == first.step.step_id

    # The same prompt sampled again is another sample: its own step id and tool-call ids.
    again, _, _ = make_service([reply])
    [resampled] = await again.complete(turn(history[:1], tools=TOOLS))
    assert resampled.step.step_id != first.step.step_id
    assert resampled.parsed.tool_calls[0].id != call.id


async def test_malformed_tool_call_is_returned_as_text_and_recorded() -> None:
    bad = '<tool_call>\n{"name": "ls", "arguments": {"path": }\n</tool_call><|im_end|>'
    service, _, _ = make_service([bad])
    counted = REGISTRY.get_sample_value(
        "titoflow_ingress_tool_parse_errors_total", {"api": "openai.chat"}
    )
    [result] = await service.complete(turn([Message(role="user", content="x")], tools=TOOLS))
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
    [second] = await service.complete(turn(history, tools=TOOLS))
    assert second.step.prefix == "rendered"


async def test_a_failed_publish_leaves_the_chain_as_it_was() -> None:
    service, engine, publisher = make_service(["a<|im_end|>", "b<|im_end|>", "c<|im_end|>"])
    history = [Message(role="user", content="x")]
    [first] = await service.complete(turn(history))
    history += [Message(role="assistant", content="a"), Message(role="user", content="y")]
    publisher.fail_next = True
    with pytest.raises(PublishFailed):
        await service.complete(turn(history))
    [retried] = await service.complete(turn(history))
    assert retried.step.parent_step_id == first.step.step_id
    assert engine.prompts[1] == engine.prompts[2]
    assert len(publisher.events) == 2


async def test_length_cut_reply_is_closed_before_the_next_turn() -> None:
    service, _, _ = make_service(["word " * 100, "ok<|im_end|>"])
    history = [Message(role="user", content="x")]
    [first] = await service.complete(turn(history))
    assert first.step.finish_reason == "length"
    history += [
        Message(role="assistant", content=first.parsed.content),
        Message(role="user", content="y"),
    ]
    [second] = await service.complete(turn(history))
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
    [first] = await service.complete(turn(history, tools=TOOLS))
    [call] = first.parsed.tool_calls
    rewritten = ToolCall(id=call.id, name="ls_v2", arguments='{"all":true,"path":"/tmp/"}')
    history += [
        Message(role="assistant", content="", tool_calls=(rewritten,)),
        Message(role="tool", content="a.txt", tool_call_id=call.id),
    ]
    [second] = await service.complete(turn(history, tools=TOOLS))
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
    [result] = await service.complete(asked)
    assert len(result.step.completion_ids) == 3 and result.step.finish_reason == "length"


async def test_two_samples_of_one_prompt_each_continue_the_one_the_client_echoes() -> None:
    replies = ["hi<|im_end|>", "A<|im_end|>", "B<|im_end|>", "B<|im_end|>"]
    replies += ["after A<|im_end|>", "after B<|im_end|>", "after twin<|im_end|>"]
    service, engine, _ = make_service(replies)
    start = [Message(role="user", content="q")]
    [first] = await service.complete(turn(start))
    ask = [*start, Message(role="assistant", content="hi"), Message(role="user", content="go")]
    [a] = await service.complete(turn(ask))  # the head's prompt...
    [b] = await service.complete(turn(ask))  # ...sampled again: TITO from the step before
    [twin] = await service.complete(turn(ask))  # the same answer as b: same tokens
    assert len({a.step.step_id, b.step.step_id, twin.step.step_id}) == 3
    for sample in (a, b, twin):
        assert sample.step.prefix == "tito" and sample.step.parent_step_id == first.step.step_id
    assert engine.prompts[1] == engine.prompts[2] == engine.prompts[3]

    def then(answer: str) -> list[Message]:
        return [*ask, Message(role="assistant", content=answer), Message(role="user", content="ok")]

    [after_a] = await service.complete(turn(then("A")))
    [after_b] = await service.complete(turn(then("B")))
    assert after_a.step.parent_step_id == a.step.step_id
    # b and its twin match alike: the one recorded first is continued (either is exact).
    assert after_b.step.parent_step_id == b.step.step_id
    assert engine.prompts[5][: len(engine.prompts[2]) + 2] == engine.prompts[2] + list(
        b.step.completion_ids
    )
    [again] = await service.complete(turn(then("B")))
    assert again.step.parent_step_id == b.step.step_id  # a second sample after b, by TITO


def token_call(prompt_ids: list[int], session: str = "s1") -> TokenCall:
    return TokenCall(
        session=SessionRef(session_id=session), model="m", prompt_ids=tuple(prompt_ids)
    )


async def test_white_box_calls_record_their_steps_on_the_chat_path() -> None:
    replies = ["Hello<|im_end|>", "one", "two", "after<|im_end|>"]
    service, engine, publisher = make_service(replies, matcher="tool_call_id")
    history = [Message(role="user", content="hi")]
    [chat] = await service.complete(turn(history, tools=TOOLS))
    held = [*engine.prompts[0], *chat.step.completion_ids]

    first = await service.generate_tokens(token_call([*held, 11]))
    step = first.step
    assert (step.api, step.prefix, step.prefix_len, step.prompt_tail_ids) == (
        "generate",
        "tito",
        len(held),
        [11],
    )
    assert (step.parent_step_id, step.chain_id) == (chat.step.step_id, chat.step.chain_id)
    # No conversation of its own: no messages or tools, matched token for token, under the
    # tools of the chain it extends.
    assert (step.new_messages, step.response_message, step.tools, step.matcher) == (
        [],
        {},
        [],
        "strict",
    )
    assert step.tools_hash == chat.step.tools_hash and step.stream is False

    extended = [*held, 11, *step.completion_ids, 12]
    second = await service.generate_tokens(token_call(extended))
    assert second.step.parent_step_id == step.step_id and second.step.prompt_tail_ids == [12]
    assert engine.prompts[2] == extended

    # A chat turn that echoes the chat answer continues the chat step, not the white-box ones.
    history += [Message(role="assistant", content="Hello"), Message(role="user", content="more")]
    [after] = await service.complete(turn(history, tools=TOOLS))
    assert (after.step.prefix, after.step.parent_step_id) == ("tito", chat.step.step_id)
    assert [e.api for e in publisher.events if isinstance(e, StepRecorded)] == [
        "openai.chat",
        "generate",
        "generate",
        "openai.chat",
    ]


async def test_a_white_box_prompt_no_chain_holds_starts_a_chain_of_its_own() -> None:
    service, _, _ = make_service(["one"])
    result = await service.generate_tokens(token_call([1, 2, 3], session="fresh"))
    step = result.step
    assert (step.prefix, step.prefix_len, step.parent_step_id) == ("rendered", 0, None)
    assert (step.prompt_tail_ids, step.chain_id, step.tools_hash) == ([1, 2, 3], step.step_id, "")
    assert (result.prompt_len, result.generation.token_ids) == (3, step.completion_ids)


class Weights:
    """The control plane as the service sees it, never paused: the current weight version."""

    def __init__(self, version: str) -> None:
        self.version: str | None = version

    async def admit(self) -> None:
        return None


async def test_refused_calls_publish_nothing_and_keep_the_chain() -> None:
    weights = Weights("v1")
    replies = ["a<|im_end|>", "fresh<|im_end|>", "b<|im_end|>"]
    service, engine, publisher = make_service(replies, control=weights, partial_rollout=False)
    history = [Message(role="user", content="x")]
    [first] = await service.complete(turn(history))
    held = [*engine.prompts[0], *first.step.completion_ids]
    history += [Message(role="assistant", content="a"), Message(role="user", content="y")]

    weights.version = "v2"  # partial rollout off: the chain stays on the weights it started on
    with pytest.raises(TrajectoryVersionChanged):
        await service.complete(turn(history))
    with pytest.raises(TrajectoryVersionChanged):
        await service.generate_tokens(token_call([*held, 7]))
    [fresh] = await service.complete(turn(history[:1], session="s2"))  # a new chain may start
    assert fresh.step.prefix == "rendered"

    weights.version = "v1"
    [after] = await service.complete(turn(history))
    assert (after.step.prefix, after.step.parent_step_id) == ("tito", first.step.step_id)
    assert len(publisher.events) == 3 and len(engine.prompts) == 3


async def test_the_step_limit_holds_for_white_box_calls_too() -> None:
    service, engine, publisher = make_service(["a<|im_end|>"], max_steps_per_session=1)
    [first] = await service.complete(turn([Message(role="user", content="x")]))
    with pytest.raises(SessionStepLimit):
        await service.generate_tokens(token_call([*engine.prompts[0], *first.step.completion_ids]))
    assert len(publisher.events) == 1


class HeldUntilResume:
    """A control plane paused until ``resume`` is set: admitted calls wait for it."""

    version: str | None = None

    def __init__(self) -> None:
        self.resume = asyncio.Event()

    async def admit(self) -> None:
        await self.resume.wait()


async def test_an_ended_session_takes_no_more_calls_nor_a_reopening() -> None:
    held = HeldUntilResume()
    held.resume.set()
    service, engine, publisher = make_service(["a<|im_end|>", "b<|im_end|>"], control=held)
    history = [Message(role="user", content="x")]
    [first] = await service.complete(turn(history))
    await service.finalize(SessionRef(session_id="s1"), {}, reward=1.0)
    history += [Message(role="assistant", content="a"), Message(role="user", content="y")]
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "chat": lambda: service.complete(turn(history)),
        "stream": lambda: service.open_stream(turn(history)),
        "a fresh conversation": lambda: service.complete(turn(history[:1])),
        "white-box": lambda: service.generate_tokens(
            token_call([*engine.prompts[0], *first.step.completion_ids, 7])
        ),
        "reopen": lambda: service.open_session(
            SessionRef(session_id="s1"), None, {}, SessionOptions()
        ),
    }
    for name, call in calls.items():
        with pytest.raises(SessionAlreadyEnded) as caught:
            await call()
        assert caught.value.how == "finalized", name
    # An end another replica published, as its follower hands it over, counts the same.
    service.ended.record(SessionEnded(session_id="s2", event_time=1.0, how="idle"))
    with pytest.raises(SessionAlreadyEnded, match="idle timeout"):
        await service.complete(turn(history[:1], session="s2"))
    assert [type(e) for e in publisher.events] == [StepRecorded, SessionFinalized, SessionEnded]
    assert len(engine.prompts) == 1

    # A call admitted while paused, whose session ends before the resume, is refused then.
    held.resume.clear()
    waiting = asyncio.create_task(service.complete(turn(history[:1], session="s3")))
    await asyncio.sleep(0.01)
    await service.discard(SessionRef(session_id="s3"), {})
    held.resume.set()
    with pytest.raises(SessionAlreadyEnded) as caught:
        await waiting
    assert caught.value.how == "discarded" and len(engine.prompts) == 1
    # Other sessions are served as ever.
    assert (await service.complete(turn(history[:1], session="s4")))[0].step.prefix == "rendered"

"""Build modes and the recompute divergence policy on the real Qwen3 chat template (no engine;
the recompute stage's own process loop on the real broker, under the kill switch):
``last-step`` re-renders the final conversation, ``recompute`` rebuilds a diverged segment on
the rendered prompt; a token keeps its sampled logprob only where its context is unchanged,
every other trainable token is marked for recomputation (source 3) or masked (source 0)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter

from schemas.events import (
    LOGPROB_SOURCE_NONE,
    LOGPROB_SOURCE_RECOMPUTED,
    BuildMode,
    DeadLetter,
    LogprobsMode,
    RecomputeRequested,
    SamplingUsed,
    SegmentFinalized,
    SessionOpened,
    StepRecorded,
    VersionSpan,
)
from schemas.reasons import DeadLetterReason, SplitReason
from tests.support.factories import block
from tests.support.factories import recorded_step as step
from tests.support.families import qwen3
from tests.support.topics import read_until
from titoflow.bus import Publisher
from titoflow.engine.api import PromptScores
from titoflow.settings import Settings
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from workers import metrics
from workers.assembler import Assembler
from workers.assembly.pending import needs_recompute
from workers.rebuild import Rebuilder
from workers.recompute import RecomputeWorker, complete, fill
from workers.worker import Worker

SYSTEM = {"role": "system", "content": "You are a shell agent."}
ASK = {"role": "user", "content": "List the files."}
NEXT = {"role": "user", "content": "Which one is largest?"}
REMINDER = "<system-reminder>Today is Friday.</system-reminder>\n"


def renderer() -> ChatRenderer:
    return ChatRenderer(qwen3())


def encode(text: str) -> list[int]:
    return list(qwen3().encode(text, add_special_tokens=False))


def render(messages: list[dict[str, Any]], generation: bool = True) -> list[int]:
    turns = [Message.from_template_dict(m) for m in messages]
    return renderer().full_prompt(turns, (), {}, add_generation_prompt=generation)


def turn(
    step_id: str,
    tail: list[int],
    completion: list[int],
    new_messages: list[dict[str, Any]],
    reply: str,
    parent: str | None = None,
    prefix_len: int = 0,
) -> StepRecorded:
    return step(
        step_id,
        tail,
        completion,
        parent,
        prefix_len,
        new_messages=new_messages,
        response_message={"role": "assistant", "content": reply},
        weight_versions=[VersionSpan(version="v1", start=0, end=len(completion))],
    )


END = renderer().terminator_id
FIRST_REPLY, SECOND_REPLY = "a.txt b.txt", "b.txt"
FIRST_PROMPT = render([SYSTEM, ASK])
FIRST = turn("a", FIRST_PROMPT, [*encode(FIRST_REPLY), END], [SYSTEM, ASK], FIRST_REPLY)
SENT = FIRST_PROMPT + FIRST.completion_ids
TAIL = renderer().continuation(
    [Message.from_template_dict(m) for m in (SYSTEM, ASK)]
    + [Message(role="assistant", content=FIRST_REPLY), Message.from_template_dict(NEXT)],
    3,
    True,
    (),
    {},
)
SECOND = turn("b", TAIL, [*encode(SECOND_REPLY), END], [NEXT], SECOND_REPLY, "a", len(SENT))


def assembler(build_mode: BuildMode = "concat", recompute: bool = False) -> Assembler:
    return Assembler(rebuilder=Rebuilder(renderer()), build_mode=build_mode, recompute=recompute)


def run(asm: Assembler, *events: StepRecorded | SessionOpened) -> list[SegmentFinalized]:
    for offset, event in enumerate(events):
        asm.apply(event.model_dump_json().encode(), 0, offset)
    return asm.finalize("s", "finalized")


def trainable(segment: SegmentFinalized) -> list[int]:
    return [p for p, m in enumerate(segment.loss_mask) if m]


def test_assistant_turns_are_found_in_a_render() -> None:
    rebuilder = Rebuilder(renderer())
    full = render([SYSTEM, ASK, FIRST.response_message], generation=False)
    [(start, end)] = rebuilder.assistant_spans(full)
    # Content through <|im_end|>; Qwen3 writes an empty think block into the last turn.
    assert full[start:end] == encode("<think>\n\n</think>\n\n") + FIRST.completion_ids
    assert rebuilder.assistant_spans(FIRST_PROMPT) == []  # a generation prompt is not a turn


def test_last_step_re_renders_the_final_conversation() -> None:
    [concat] = run(assembler(), FIRST, SECOND)
    [last] = run(assembler("last-step"), FIRST, SECOND)
    conversation = [SYSTEM, ASK, FIRST.response_message, NEXT, SECOND.response_message]
    assert concat.build_mode == "concat" and last.build_mode == "last-step"
    # Tokens: the template's render of the final conversation, which writes an empty think block
    # into the last assistant turn (Qwen3) that the model never generated.
    assert last.token_ids == render(conversation, generation=False) != concat.token_ids
    think = encode("<think>\n\n</think>\n\n")
    second = last.steps[1]
    assert last.token_ids[second.completion_start : second.completion_end] == (
        think + SECOND.completion_ids
    )
    # The first turn's tokens and context are unchanged: sampled logprobs and versions kept.
    first = last.steps[0]
    assert (first.completion_start, first.completion_end) == (len(FIRST_PROMPT), len(SENT))
    kept = list(range(first.completion_start, first.completion_end))
    assert trainable(last) == kept  # without recompute the re-rendered turn is masked, source 0
    assert [last.logprobs[p] for p in kept] == FIRST.completion_logprobs
    assert set(last.logprob_source[second.completion_start :]) == {0}
    assert [(v.start, v.end) for v in last.weight_versions] == [(kept[0], kept[-1] + 1)]

    # With recompute the whole re-rendered turn is trainable and waits for the engine.
    [pending] = run(assembler("last-step", recompute=True), FIRST, SECOND)
    span = range(second.completion_start, second.completion_end)
    assert trainable(pending) == kept + list(span)
    assert {pending.logprob_source[p] for p in span} == {LOGPROB_SOURCE_RECOMPUTED}
    assert needs_recompute(pending) and not needs_recompute(last)


def test_a_session_chooses_its_build_mode() -> None:
    opened = SessionOpened(session_id="s", event_time=0.0, options={"build_mode": "last-step"})
    [segment] = run(assembler(), opened, FIRST, SECOND)
    assert segment.build_mode == "last-step"


def rewritten() -> StepRecorded:
    """Claude Code's turn 2 on another replica: a reminder injected into the first user message,
    the whole conversation rendered."""
    edited = {**ASK, "content": REMINDER + ASK["content"]}
    messages = [SYSTEM, edited, FIRST.response_message, NEXT]
    completion = [*encode(SECOND_REPLY), END]
    return turn("b2", render(messages), completion, messages, SECOND_REPLY)


def test_a_history_rewrite_splits_or_is_rebuilt_for_recompute() -> None:
    old, new = run(assembler(), FIRST, rewritten())
    assert new.split_reason is SplitReason.HISTORY_REWRITE and old.token_ids == SENT
    n = len(new.token_ids)
    assert trainable(new) == list(range(n - len(rewritten().completion_ids), n))

    [rebuilt] = run(assembler(recompute=True), FIRST, rewritten())
    step2 = rewritten()
    assert rebuilt.token_ids == step2.prompt_tail_ids + step2.completion_ids
    assert rebuilt.split_reason is None
    assert rebuilt.diagnostics == {"history_rewrite": 1, "rebuilt": 1}
    first, second = rebuilt.steps
    assert [s.step_id for s in rebuilt.steps] == ["a", "b2"]
    turn = range(first.completion_start, first.completion_end)
    assert rebuilt.token_ids[first.completion_start : first.completion_end] == FIRST.completion_ids
    # Same tokens, other context (the reminder precedes them): recomputed, not copied.
    assert {rebuilt.logprob_source[p] for p in turn} == {LOGPROB_SOURCE_RECOMPUTED}
    assert rebuilt.logprobs[second.completion_start :] == step2.completion_logprobs
    assert rebuilt.logprob_source[second.completion_start :] == [1] * len(step2.completion_ids)
    assert trainable(rebuilt) == [*turn, *range(second.completion_start, second.completion_end)]


def test_a_rewrite_that_drops_generated_turns_still_splits() -> None:
    compacted = [SYSTEM, {"role": "user", "content": "Summary: listed files."}, NEXT]
    step2 = turn("b3", render(compacted), [*encode("ok"), END], compacted, "ok")
    asm = assembler(recompute=True)
    old, new = run(asm, FIRST, step2)
    assert (
        old.token_ids == SENT
        and new.split_reason is SplitReason.HISTORY_REWRITE
        and new.diagnostics["rebuild_fallback"] == 1
    )


async def test_the_recompute_stage_fills_logprobs_and_versions() -> None:
    [pending] = run(assembler(recompute=True), FIRST, rewritten())
    where = [p for p, s in enumerate(pending.logprob_source) if s == LOGPROB_SOURCE_RECOMPUTED]
    scores = PromptScores([None] + [-float(p) for p in range(1, max(where) + 1)], "v7")
    done = fill(pending, scores)
    assert [done.logprobs[p] for p in where] == [-float(p) for p in where]
    assert not needs_recompute(done) and done.segment_id == pending.segment_id
    assert ("v7", where[0], where[-1] + 1) in [
        (v.version, v.start, v.end) for v in done.weight_versions
    ]
    # The kill switch (no scorer): masked with source none, and the segment says so.
    masked = await complete(pending, None)
    assert {masked.loss_mask[p] for p in where} == {0} and not needs_recompute(masked)
    assert masked.diagnostics["recompute_masked_disabled"] == len(where)


@pytest.mark.parametrize(
    ("mode", "temperature", "top_p", "recomputed"),
    [
        ("raw_logprobs", 1.0, 1.0, True),
        ("raw_logprobs", 0.7, 1.0, True),
        ("processed_logprobs", 1.0, 1.0, True),
        ("processed_logprobs", 0.7, 1.0, False),
        ("processed_logprobs", 1.0, 0.9, False),
    ],
)
async def test_the_recompute_stage_keeps_each_step_one_policy(
    mode: LogprobsMode, temperature: float, top_p: float, recomputed: bool
) -> None:
    """Prompt logprobs are raw in either engine mode (vLLM's prompt tokens skip the sampling
    processors): they fill a rebuilt turn whose step recorded raw logprobs, or processed ones
    that sampling left unchanged (T 1, no cut); any other processed turn is masked, counted,
    and costs no engine call."""
    [pending] = run(assembler(recompute=True), FIRST, rewritten())
    sampling = SamplingUsed(temperature=temperature, top_p=top_p, max_tokens=16, logprobs_mode=mode)
    pending = pending.model_copy(
        update={"steps": [s.model_copy(update={"sampling": sampling}) for s in pending.steps]}
    )
    where = [p for p, s in enumerate(pending.logprob_source) if s == LOGPROB_SOURCE_RECOMPUTED]
    first = pending.steps[0]
    assert where and set(where) <= set(range(first.completion_start, first.completion_end))
    sampled = range(pending.steps[1].completion_start, len(pending.token_ids))
    scorer = _Scorer()
    masked_before = metrics.RECOMPUTE_TOKENS.labels("masked_processed")._value.get()
    done = await complete(pending, scorer)
    assert not needs_recompute(done)
    if recomputed:
        assert [done.logprobs[p] for p in where] == [-1.0] * len(where)
        assert {done.logprob_source[p] for p in where} == {LOGPROB_SOURCE_RECOMPUTED}
        assert {done.loss_mask[p] for p in where} == {1}
        assert scorer.calls == [pending.token_ids[: where[-1] + 1]]
        assert "recompute_masked_processed" not in done.diagnostics
    else:
        assert {done.loss_mask[p] for p in where} == {0}
        assert {done.logprob_source[p] for p in where} == {LOGPROB_SOURCE_NONE}
        assert scorer.calls == []
        assert done.diagnostics["recompute_masked_processed"] == len(where)
        masked = metrics.RECOMPUTE_TOKENS.labels("masked_processed")._value.get()
        assert masked == masked_before + len(where)
    # The step's own sampled tokens keep their recorded logprobs either way.
    assert [done.logprobs[p] for p in sampled] == [pending.logprobs[p] for p in sampled]
    assert {done.loss_mask[p] for p in sampled} == {1}


def test_routed_experts_of_a_rebuilt_segment_hold_only_where_the_context_is_unchanged() -> None:
    rows = np.arange(len(SENT) * 4).reshape(len(SENT), 2, 2) % 8
    first = FIRST.model_copy(update={"routed_experts": block(0, rows[: len(SENT) - 1])})
    [rebuilt] = run(assembler(recompute=True), first, rewritten())
    changed = next(
        i for i, (a, b) in enumerate(zip(SENT, rebuilt.token_ids, strict=False)) if a != b
    )
    assert rebuilt.routed_experts is not None
    assert (rebuilt.routed_experts.start, rebuilt.routed_experts.rows) == (0, changed)


async def test_the_recompute_stage_under_the_kill_switch_masks_without_an_engine(
    settings: Settings,
) -> None:
    """A real ``RecomputeWorker`` on a real broker, its engine URL pointing nowhere: with the kill
    switch it publishes the queued segment masked, and dead-letters a poison record."""
    [pending] = run(assembler(recompute=True), FIRST, rewritten())
    killed = settings.model_copy(
        update={
            "recompute_disabled": True,
            "engine_url": "http://127.0.0.1:9",
            "recompute_group": f"{settings.topic_prefix}-recompute",
        }
    )
    request = RecomputeRequested(session_id="s", event_time=1.0, segment=pending)
    reason = DeadLetterReason.UNDECODABLE_RECOMPUTE_REQUEST
    letters_before = metrics.DEAD_LETTERS.labels(reason.value)._value.get()
    publisher = Publisher(killed)
    try:
        await publisher.publish(killed.topic("recompute"), "s", b"\xff poison")
        await publisher.publish(killed.topic("recompute"), "s", request.model_dump_json().encode())
    finally:
        await publisher.stop()
    stop = asyncio.Event()
    running = asyncio.create_task(RecomputeWorker(killed).run(stop))
    try:
        [done] = await read_until(
            killed, killed.topic("segments"), TypeAdapter(SegmentFinalized), bool
        )
        [letter] = await read_until(killed, killed.topic("dlq"), TypeAdapter(DeadLetter), bool)
    finally:
        stop.set()
        await running
    assert done.segment_id == pending.segment_id and not needs_recompute(done)
    where = [p for p, s in enumerate(pending.logprob_source) if s == LOGPROB_SOURCE_RECOMPUTED]
    assert {done.loss_mask[p] for p in where} == {0} and {
        done.logprob_source[p] for p in where
    } == {0}
    assert done.diagnostics["recompute_masked_disabled"] == len(where)
    assert letter.reason is reason and letter.detail
    assert metrics.DEAD_LETTERS.labels(reason.value)._value.get() == letters_before + 1


class _Scorer:
    """A SCRIPTED ENGINE DOUBLE for the recompute stage: prompt logprobs -1.0 after ``delay_s``,
    the token ids of each call kept."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: list[list[int]] = []

    async def prompt_logprobs(self, token_ids: list[int], request_id: str) -> PromptScores:
        self.calls.append(token_ids)
        await asyncio.sleep(self.delay_s)
        return PromptScores([None] + [-1.0] * (len(token_ids) - 1), "v1")

    async def close(self) -> None:
        return None


async def test_a_session_last_segment_never_overtakes_its_segment_in_recompute(
    settings: Settings, monkeypatch: Any
) -> None:
    [pending] = run(assembler(recompute=True), FIRST, rewritten())
    pending = pending.model_copy(update={"last_of_session": False})
    last = pending.model_copy(
        update={
            "segment_id": "last",
            "last_of_session": True,
            "logprob_source": [min(s, 1) for s in pending.logprob_source],
            "logprobs": [
                0.0 if s == 3 else lp
                for s, lp in zip(pending.logprob_source, pending.logprobs, strict=True)
            ],
        }
    )
    assert needs_recompute(pending) and not needs_recompute(last)
    # The worker: the last segment follows the pending one through <prefix>.recompute.
    staged = settings.model_copy(
        update={
            "recompute_group": f"{settings.topic_prefix}-rc",
            "engine_url": "http://127.0.0.1:9",
        }
    )
    worker = Worker(staged)
    sent: list[tuple[str, str, bytes]] = []

    async def capture(records: list[tuple[str, str, bytes]]) -> None:
        sent.extend(records)

    monkeypatch.setattr(worker.publisher, "publish_many", capture)
    await worker._publish_segments([pending])
    await worker._publish_segments([last])
    assert [topic for topic, _, _ in sent] == [staged.topic("recompute")] * 2
    # The recompute stage, on the real broker: the slow one first, then the last one.
    publisher = Publisher(staged)
    try:
        for topic, key, value in sent:
            await publisher.publish(topic, key, value)
    finally:
        await publisher.stop()
    stage = RecomputeWorker(staged)
    await stage.engine.close()
    # Slow, so a segment without pending tokens read after it would be published first if the
    # stage did not keep the order it read.
    stage.engine = _Scorer(delay_s=1.0)  # type: ignore[assignment]
    stop = asyncio.Event()
    running = asyncio.create_task(stage.run(stop))
    try:
        done = await read_until(
            staged, staged.topic("segments"), TypeAdapter(SegmentFinalized), lambda s: len(s) >= 2
        )
    finally:
        stop.set()
        await running
    assert [s.segment_id for s in done] == [pending.segment_id, "last"]
    assert not needs_recompute(done[0]) and done[1].last_of_session

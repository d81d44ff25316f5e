"""Segment assembly (concat/TITO) on hand-made step events: exact tokens, masks, logprobs,
forks, divergence, duplicates, late and replayed events, and the commit watermark."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.events import (
    SegmentFinalized,
    SessionDiscarded,
    SessionFinalized,
    SessionOpened,
    SessionOptions,
    StepRecorded,
)
from schemas.reasons import DeadLetterReason, DiscardReason, SplitReason
from tests.support.factories import THREE_TURNS, assemble
from tests.support.factories import recorded_step as step
from workers.assembler import Assembler


def test_concat_segment_holds_every_token_with_mask_logprob_and_source() -> None:
    [segment] = assemble(THREE_TURNS)
    assert segment.token_ids == [1, 2, 3, 10, 11, 4, 12, 5, 6, 13, 14, 15]
    assert segment.loss_mask == [0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1]
    assert segment.logprob_source == segment.loss_mask
    generated = [lp for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True) if m]
    assert generated == [-0.5, -1.0, -0.5, -0.5, -1.0, -1.5]
    assert [(s.prompt_start, s.completion_start, s.completion_end) for s in segment.steps] == [
        (0, 3, 5),
        (5, 6, 7),
        (7, 9, 12),
    ]
    assert segment.instance_id == "i1" and segment.metadata == {"reward": 1.0}
    assert segment.split_reason is None


def test_replay_is_byte_identical_and_ids_name_the_last_step() -> None:
    first, again = assemble(THREE_TURNS), assemble(THREE_TURNS)
    assert [s.model_dump_json() for s in first] == [s.model_dump_json() for s in again]
    # Re-reading a finished session from mid-way rebuilds a tail with the same id (dropped).
    assembler = Assembler()
    rendered_c = step("c", [1, 2, 3, 10, 11, 4, 12, 5, 6], [13, 14, 15])
    assembler.add_step(rendered_c, 0, 2)
    [tail] = assembler.finalize("s", "finalized")
    assert tail.segment_id == first[0].segment_id


def test_step_from_an_earlier_point_forks_a_segment() -> None:
    events = [*THREE_TURNS, step("d", [7], [16], parent="a", prefix_len=5)]
    main, fork = assemble(events)
    assert fork.split_reason is SplitReason.FORK
    assert fork.token_ids == [1, 2, 3, 10, 11, 7, 16]
    assert main.token_ids[:5] == fork.token_ids[:5]
    assert main.segment_id != fork.segment_id


def test_rendered_step_extends_when_its_prompt_starts_with_the_segment() -> None:
    cache_miss = step("b2", [1, 2, 3, 10, 11, 4], [12])  # another replica rendered the same
    [segment] = assemble([THREE_TURNS[0], cache_miss, cache_miss])  # redelivered: dropped
    assert segment.token_ids == [1, 2, 3, 10, 11, 4, 12]
    assert segment.steps[1].prefix == "rendered"
    assert "superseded_steps" not in segment.diagnostics


USER = {"role": "user", "content": "list files"}
REPLY = {"role": "assistant", "content": "ab"}
NEXT = {"role": "user", "content": "and now?"}
FIRST = step("a", [1, 2, 3], [10, 11], new_messages=[USER], response_message=REPLY)


def rendered(prompt: list[int], messages: list[dict[str, Any]], **extra: Any) -> StepRecorded:
    return step("r", prompt, [12], new_messages=messages, response_message=REPLY, **extra)


def decode(ids: list[int]) -> str:
    """A toy vocabulary where 10, 11 spell "a", "b" and 50 spells "ab" (a merge)."""
    return "".join({10: "a", 11: "b", 50: "ab"}.get(i, f"<{i}>") for i in ids)


def classify(event: StepRecorded) -> tuple[str | None, dict[str, int]]:
    assembler = Assembler(decode=decode)
    assembler.add_step(FIRST, 0, 0)
    assembler.add_step(event, 0, 1)
    segments = assembler.finalize("s", "finalized")
    return segments[-1].split_reason, segments[-1].diagnostics


def test_rendered_steps_are_classified_when_they_do_not_continue_the_segment() -> None:
    conversation = [USER, REPLY, NEXT]
    # Another replica rendered the same conversation to the same tokens: a cache miss, extended.
    assert classify(rendered([1, 2, 3, 10, 11, 7], conversation)) == (None, {"cache_miss": 1})
    # The same conversation, but the template renders the reply as other ids of the same text.
    assert classify(rendered([1, 2, 3, 50, 7], conversation))[0] == "retokenization"
    # ... or as other text (Qwen3 drops <think> from history).
    assert classify(rendered([1, 2, 3, 11, 7], conversation))[0] == "template"
    # A user message edited after the fact (Claude Code injects <system-reminder>s).
    edited = [{**USER, "content": "<system-reminder>x</system-reminder>list files"}, REPLY, NEXT]
    assert classify(rendered([1, 2, 4, 10, 11, 7], edited)) == (
        "history_rewrite",
        {"history_rewrite": 1},
    )
    assert classify(rendered([9, 2, 3, 10, 11, 7], conversation, tools_hash="new"))[0] == (
        "tool_change"
    )


def test_a_segment_at_the_size_limit_is_emitted_and_continues_as_context() -> None:
    assembler = Assembler(max_segment_tokens=6)
    for offset, event in enumerate(THREE_TURNS):
        outcome = assembler.add_step(event, 0, offset)
        if event.step_id == "b":
            [full] = outcome.segments
    assert full.finalize_reason == "size" and full.token_ids == [1, 2, 3, 10, 11, 4, 12]
    [after] = assembler.finalize("s", "finalized")
    assert after.split_reason is SplitReason.SIZE
    assert after.token_ids[:7] == full.token_ids and after.loss_mask[:7] == [0] * 7
    assert after.loss_mask[7:] == [0, 0, 1, 1, 1] and after.segment_id != full.segment_id


def test_weight_versions_metadata_and_rollout_ids_reach_the_segment() -> None:
    from schemas.events import SessionOpened, VersionSpan

    assembler = Assembler()
    opened = SessionOpened(
        session_id="s", event_time=0.0, instance_id="i9", metadata={"rollout_id": "r1", "k": 1}
    )
    assembler.apply(opened.model_dump_json().encode(), 0, 0)
    versioned = step(
        "a",
        [1, 2],
        [10, 11, 12],
        weight_versions=[
            VersionSpan(version="v1", start=0, end=1),
            VersionSpan(version="v2", start=1, end=3),
        ],
    )
    assembler.add_step(versioned, 0, 1)
    [segment] = assembler.finalize("s", "finalized", {"reward": 0.5})
    assert [(v.version, v.start, v.end) for v in segment.weight_versions] == [
        ("v1", 2, 3),
        ("v2", 3, 5),
    ]
    assert (segment.instance_id, segment.rollout_id) == ("i9", "r1")
    assert segment.metadata == {"rollout_id": "r1", "k": 1, "reward": 0.5}


def test_duplicates_late_steps_and_partial_sessions() -> None:
    assembler = Assembler()
    assert assembler.add_step(THREE_TURNS[0], 0, 0).skipped_reason is None
    assert assembler.add_step(THREE_TURNS[0], 0, 1).skipped_reason == "duplicate step id"
    assert len(assembler.finalize("s", "finalized")) == 1
    late = assembler.add_step(THREE_TURNS[1], 0, 2)
    assert late.dead_letter_reason is DeadLetterReason.LATE_STEP

    # A worker that begins reading after the session's first step: a tail of the session, never
    # a segment. Each of its events is dead-lettered, the finalize with its reward included.
    fresh = Assembler()
    orphan = fresh.add_step(THREE_TURNS[1], 0, 5)
    assert orphan.dead_letter_reason is DeadLetterReason.PARTIAL_SESSION
    assert fresh.counters["partial_sessions"] == 1
    rendered = step("r", [1, 2, 3, 4, 5, 6], [7], session="s")  # not a start either, now
    assert fresh.apply(rendered.model_dump_json().encode(), 0, 6).dead_letter_reason is (
        DeadLetterReason.PARTIAL_SESSION
    )
    end = SessionFinalized(session_id="s", event_time=1.0, reward=1.0)
    applied = fresh.apply(end.model_dump_json().encode(), 0, 7)
    assert applied.dead_letter_reason is DeadLetterReason.PARTIAL_SESSION
    assert applied.segments == [] and applied.notice is None
    assert fresh.open_sessions == [] and fresh.counters["partial_sessions"] == 1


def test_sessions_that_lose_steps_to_retention_are_partial() -> None:
    assembler = Assembler()
    assembler.add_step(THREE_TURNS[0], 0, 0)
    assembler.add_step(step("o", [1], [2], session="other"), 1, 0)
    assert assembler.lose_partition(0) == ["s"]
    assert assembler.open_sessions == ["other"]
    later = assembler.apply(THREE_TURNS[2].model_dump_json().encode(), 0, 9)
    assert later.dead_letter_reason is DeadLetterReason.PARTIAL_SESSION
    assert assembler.close("s", "idle").segments == []
    # a partition given away takes its partial sessions with it
    assembler.add_step(THREE_TURNS[1], 0, 10)
    assert assembler.drop_partitions({0}) == ["s"]


def test_wrong_prefix_length_is_a_dead_letter_not_a_wrong_segment() -> None:
    assembler = Assembler()
    assembler.add_step(THREE_TURNS[0], 0, 0)
    outcome = assembler.add_step(step("b", [4], [12], parent="a", prefix_len=4), 0, 1)
    assert outcome.dead_letter_reason is DeadLetterReason.PREFIX_LENGTH_MISMATCH


def test_commit_offset_never_splits_a_session() -> None:
    assembler = Assembler()
    assembler.add_step(step("x", [1], [2], session="s1"), 3, 10)
    assembler.add_step(step("y", [1], [2], session="s2"), 3, 12)
    assembler.add_step(step("z", [1], [2], session="s3"), 4, 7)
    assert assembler.commit_offset(3, 20) == 10  # below the oldest open session
    assembler.finalize("s1", "finalized")
    assert assembler.commit_offset(3, 20) == 12
    # A finished session whose events straddle the point holds it back too: a restart there
    # would otherwise rebuild that session's tail as if it were a whole session.
    assembler.add_step(step("w", [1], [2], session="s4"), 4, 9)
    assembler.add_step(step("v", [1], [2], session="s5"), 4, 10)
    assembler.add_step(step("w2", [1, 2, 5], [6], session="s4"), 4, 11)
    finalized = SessionFinalized(session_id="s4", event_time=0.0).model_dump_json().encode()
    assembler.apply(finalized, 4, 12)
    assembler.finalize("s3", "idle")
    assert assembler.commit_offset(4, 13) == 9  # s5 is open at 10, inside s4's span 9..12
    assert assembler.drop_partitions({4}) == ["s5"]
    assert assembler.commit_offset(4, 13) == 13


def trainable(segment: SegmentFinalized) -> list[int]:
    return [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]


def test_a_continued_sibling_takes_the_first_samples_place_in_one_trajectory() -> None:
    retry_of_b = step("b2", [4], [77, 78], parent="a", prefix_len=5)  # same prompt as b
    after_retry = step("c", [5], [13], parent="b2", prefix_len=8)
    unused, trajectory = assemble([THREE_TURNS[0], THREE_TURNS[1], retry_of_b, after_retry])
    # The sample nobody continued, alone: everything before it is context.
    assert unused.unused_sample and trainable(unused) == [12]
    assert unused.token_ids == [1, 2, 3, 10, 11, 4, 12]
    # The client never went back: one trajectory, its ancestor trainable in it, not a fork.
    assert trajectory.split_reason is None and trajectory.last_of_session
    assert trajectory.token_ids == [1, 2, 3, 10, 11, 4, 77, 78, 5, 13]
    assert trainable(trajectory) == [10, 11, 77, 78, 13]
    assert [s.step_id for s in trajectory.steps] == ["a", "b2", "c"]
    assert unused.segment_id != trajectory.segment_id


def test_a_session_first_prompt_sampled_twice_and_both_continued() -> None:
    again = step("a2", [1, 2, 3], [20])  # rendered: the same first prompt, another sample
    events = [
        THREE_TURNS[0],
        again,
        step("b", [4], [12], parent="a", prefix_len=5),
        step("d", [4], [21], parent="a2", prefix_len=4),
    ]
    first, second = assemble(events)
    assert not first.unused_sample and not second.unused_sample
    assert second.split_reason is SplitReason.FORK and second.diagnostics.get("forks") == 1
    assert trainable(first) == [10, 11, 12] and trainable(second) == [20, 21]
    assert second.token_ids == [1, 2, 3, 20, 4, 21]


@pytest.mark.parametrize("order", [0, 1])
def test_retries_nobody_continued_leave_the_first_step_id_standing(order: int) -> None:
    """Whatever order the samples came in: the pick depends on the events only."""
    first, again = step("a", [1, 2, 3], [10]), step("a2", [1, 2, 3], [11])
    unused, standing = assemble([first, again] if order == 0 else [again, first])
    assert unused.unused_sample and trainable(unused) == [11]
    assert not standing.unused_sample and trainable(standing) == [10]
    assert standing.last_of_session and standing.split_reason is None


def test_a_rendered_resample_nobody_continued_is_an_unused_branch() -> None:
    resample_of_b = step("b2", [1, 2, 3, 10, 11, 4], [99])  # another replica, b's prompt
    unused, trajectory = assemble([THREE_TURNS[0], THREE_TURNS[1], resample_of_b])
    assert trainable(unused) == [99] and unused.unused_sample
    assert unused.token_ids == [1, 2, 3, 10, 11, 4, 99]
    assert trainable(trajectory) == [10, 11, 12] and trajectory.split_reason is None
    assert unused.diagnostics["cache_miss"] == 1


def test_a_step_id_reused_by_another_step_is_dead_lettered_and_a_resend_is_dropped() -> None:
    assembler = Assembler()
    for offset, event in enumerate(THREE_TURNS):
        assembler.add_step(event, 0, offset)
    resent = assembler.add_step(THREE_TURNS[1], 0, 3)
    assert resent.skipped_reason == "duplicate step id" and resent.dead_letter_reason is None
    other = assembler.add_step(step("b", [4], [77], parent="a", prefix_len=5), 0, 4)
    assert other.dead_letter_reason is DeadLetterReason.STEP_ID_CONFLICT
    [segment] = assembler.finalize("s", "finalized")
    assert segment.token_ids == assemble(THREE_TURNS)[0].token_ids


def test_tokens_sampled_under_a_grammar_say_so() -> None:
    forced = step("a", [1], [10, 11], constrained=True)
    [segment] = assemble([forced])
    assert segment.logprob_source == [0, 2, 2] and segment.loss_mask == [0, 1, 1]


def _apply(assembler: Assembler, events: list[Any]) -> list[Any]:
    return [
        assembler.apply(event.model_dump_json().encode(), 0, offset)
        for offset, event in enumerate(events)
    ]


def test_opened_session_carries_instance_channel_metadata_and_reward_into_its_segments() -> None:
    opened = SessionOpened(
        session_id="s",
        event_time=0.0,
        instance_id="prompt-1",
        channel="val",
        metadata={"data_source": "gsm8k"},
        options=SessionOptions(build_mode="last-step"),
    )
    untagged = [
        step(s.step_id, s.prompt_tail_ids, s.completion_ids, s.parent_step_id, s.prefix_len)
        for s in THREE_TURNS
    ]
    forked = step("d", [7], [16], parent="a", prefix_len=5)  # a second segment (a fork)
    final = SessionFinalized(
        session_id="s",
        event_time=9.0,
        reward_components={"correct": 1.0, "format": 0.5},
        metadata={"judge": "exact"},
    )
    applied = _apply(Assembler(), [opened, *untagged, forked, final])
    first, second = applied[-1].segments
    for segment in (first, second):
        assert segment.instance_id == "prompt-1" and segment.channel == "val"
        assert segment.metadata == {"data_source": "gsm8k", "judge": "exact"}
        assert segment.reward is None
        assert segment.reward_components == {"correct": 1.0, "format": 0.5}
    assert (first.last_of_session, second.last_of_session) == (False, True)
    assert applied[-1].notice is None


def test_discard_finalizes_nothing_says_so_and_late_steps_are_dead_letters() -> None:
    assembler = Assembler()
    opened = SessionOpened(session_id="s", event_time=0.0, instance_id="i", channel="train")
    discard = SessionDiscarded(session_id="s", event_time=5.0, metadata={"why": "timeout"})
    late = step("c", [5, 6], [13], parent="b", prefix_len=7)
    applied = _apply(assembler, [opened, *THREE_TURNS[:2], discard, late])
    notice = applied[3].notice
    assert notice is not None and applied[3].segments == []
    assert notice.reason is DiscardReason.DISCARDED
    assert (notice.instance_id, notice.channel) == ("i", "train")
    assert notice.metadata == {"why": "timeout"} and notice.event_time == 5.0
    assert assembler.open_sessions == []
    assert applied[4].dead_letter_reason is not None
    # The discard sent again is skipped; a finalize after it emits nothing and is dead-lettered
    # naming the end that stands.
    again = _apply(assembler, [discard, SessionFinalized(session_id="s", event_time=6.0)])
    assert [a.notice for a in again] == [None, None] and again[1].segments == []
    assert again[0].skipped_reason is not None and again[0].dead_letter_reason is None
    assert again[1].dead_letter_reason is DeadLetterReason.ALREADY_ENDED
    assert again[1].dead_letter_detail == "discarded at 1970-01-01T00:00:05+00:00"
    # A discarded session holds no commit point back.
    assert assembler.commit_offset(0, 7) == 7


def test_a_finalized_session_without_generated_tokens_says_it_is_empty() -> None:
    opened = SessionOpened(session_id="s", event_time=3.0, instance_id="i")
    [_, applied] = _apply(Assembler(), [opened, SessionFinalized(session_id="s", event_time=4.0)])
    assert applied.segments == []
    assert applied.notice is not None and applied.notice.reason is DiscardReason.EMPTY
    assert applied.notice.instance_id == "i" and applied.notice.event_time == 3.0


def test_white_box_steps_extend_a_chat_segment_like_any_tito_step() -> None:
    chat = THREE_TURNS[0]
    white_box = step("w", [20, 21], [22, 23], parent="a", prefix_len=5, api="generate")
    [segment] = assemble([chat, white_box])
    assert segment.token_ids == [1, 2, 3, 10, 11, 20, 21, 22, 23]
    assert segment.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1]


@given(versions=st.lists(st.sampled_from(["v1", "v2", "v3"]), min_size=1, max_size=6))
def test_partial_rollout_off_masks_every_token_other_weights_sampled(versions: list[str]) -> None:
    """A session moved to a replica that could not refuse its step on newer weights: the worker
    keeps the tokens and spans as sampled and trains only on what the session's first version
    sampled (each step's completion is one span of the version drawn for it)."""
    from schemas.events import VersionSpan

    assembler = Assembler(partial_rollout=False)
    on = Assembler()  # partial rollout on: nothing masked
    tokens = 0  # the chain's length before each step: the next step's prefix
    for index, version in enumerate(versions):
        parent = f"s{index - 1}" if index else None
        event = step(
            f"s{index}",
            [index + 1],
            [20 + index, 21 + index],
            parent=parent,
            prefix_len=tokens,
            weight_versions=[VersionSpan(version=version, start=0, end=2)],
        )
        tokens += 3
        assembler.add_step(event, 0, index)
        on.add_step(event, 0, index)
    [segment] = assembler.finalize("s", "finalized")
    [unmasked] = on.finalize("s", "finalized")
    assert segment.token_ids == unmasked.token_ids and segment.logprobs == unmasked.logprobs
    assert segment.weight_versions == unmasked.weight_versions
    other = 0
    for span in segment.weight_versions:
        kept = span.version == versions[0]
        other += 0 if kept else span.end - span.start
        assert (
            segment.loss_mask[span.start : span.end] == unmasked.loss_mask[span.start : span.end]
            if kept
            else [0] * (span.end - span.start)
        )
    assert sum(unmasked.loss_mask) - sum(segment.loss_mask) == other
    assert assembler.counters["version_masked_tokens"] == other

"""Property tests of the assembler: random step / finalize / discard / open sequences, with
re-samples, forks, cache misses, redeliveries, out-of-order parents and garbage, straight into
:meth:`Assembler.apply`.

The witness here is the events themselves, read independently of the assembler: a step's true
prompt is its parent's prompt + completion (cut at ``prefix_len``) + its tail. Every emitted
segment must hold each trainable step exactly as sampled, after exactly its true prompt, and
every step the assembler accepted must be trainable in exactly one segment of its session.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.events import (
    SegmentFinalized,
    SessionDiscarded,
    SessionFinalized,
    SessionOpened,
    StepRecorded,
)
from tests.support.factories import recorded_step
from workers.assembler import Assembler

SESSIONS = ("s0", "s1")
VOCAB = 4  # a small vocabulary: identical outputs, shared prefixes and twins happen often


def f32(value: float) -> float:
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


@dataclass
class Truth:
    """What the events say, per step id (the first event under an id the assembler took)."""

    prompts: dict[str, list[int]] = field(default_factory=dict)
    events: dict[str, StepRecorded] = field(default_factory=dict)

    def full(self, step_id: str) -> list[int]:
        return self.prompts[step_id] + list(self.events[step_id].completion_ids)

    def prompt_of(self, step: StepRecorded) -> list[int] | None:
        if step.prefix == "rendered":
            return list(step.prompt_tail_ids)
        if step.parent_step_id not in self.events:
            return None
        return self.full(step.parent_step_id)[: step.prefix_len] + list(step.prompt_tail_ids)


tokens = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4)


@st.composite
def traffic(draw: st.DrawFn, garbage: bool) -> list[bytes]:
    """A seeded mix of what real sessions send, plus (``garbage``) what they must survive."""
    made: dict[str, list[tuple[str, StepRecorded]]] = {s: [] for s in SESSIONS}
    records: list[bytes] = []
    kinds = ["first", "continue", "continue", "resample", "miss", "resend", "fork"]
    if garbage:
        kinds += ["bad_parent", "bad_prefix", "bad_lengths", "bytes", "close", "open", "reuse"]
    counter = 0
    for _ in range(draw(st.integers(1, 24))):
        session = draw(st.sampled_from(SESSIONS))
        kind = draw(st.sampled_from(kinds))
        steps = made[session]
        counter += 1
        step_id = f"{session}-{counter}"
        completion = draw(tokens)
        logprobs = [f32(-0.25 * (i + 1) - counter / 64) for i in range(len(completion))]
        parent: StepRecorded | None = None
        tail = draw(tokens)
        prefix_len = 0
        if kind in ("continue", "fork", "resample", "miss", "bad_prefix") and steps:
            index = -1 if kind == "continue" else draw(st.integers(0, len(steps) - 1))
            full, parent = steps[index]
            if kind == "resample" and parent.prefix == "tito":
                sibling = parent
                parent = next(e for _, e in steps if e.step_id == sibling.parent_step_id)
                full = next(f for f, e in steps if e.step_id == sibling.parent_step_id)
                tail = list(sibling.prompt_tail_ids)
            elif kind == "resample":  # the first prompt again
                tail, parent = list(parent.prompt_tail_ids), None
            prefix_len = len(full.split(",")) if parent else 0
            if kind == "miss" and parent is not None:
                tail = [int(t) for t in full.split(",")] + tail
                parent, prefix_len = None, 0
            if kind == "bad_prefix" and parent is not None:
                prefix_len += draw(st.sampled_from([-1, 1]))
        elif kind == "resend" and steps:
            resent = steps[draw(st.integers(0, len(steps) - 1))][1]
            records.append(resent.model_dump_json().encode())
            continue
        elif kind == "bytes":
            records.append(draw(st.binary(max_size=40)))
            continue
        elif kind == "close":
            ends: list[SessionFinalized | SessionDiscarded] = [
                SessionFinalized(session_id=session, event_time=1.0, reward=1.0),
                SessionDiscarded(session_id=session, event_time=1.0),
            ]
            records.append(draw(st.sampled_from(ends)).model_dump_json().encode())
            continue
        elif kind == "open":
            opened = SessionOpened(session_id=session, event_time=0.0, instance_id="i")
            records.append(opened.model_dump_json().encode())
            continue
        elif kind == "reuse" and steps:
            step_id = steps[-1][1].step_id  # an id already used, other content
        if kind == "bad_parent":
            parent_id: str | None = f"nobody-{counter}"
            prefix_len = 3
        else:
            parent_id = parent.step_id if parent else None
        if kind == "bad_lengths":
            logprobs = logprobs[:-1]
        step = recorded_step(
            step_id,
            tail,
            completion,
            parent_id,
            max(prefix_len, 0),
            session=session,
            event_time=float(counter),
            completion_logprobs=logprobs,
            engine_request_id=step_id,
        )
        if parent_id is None or kind not in ("bad_parent", "bad_prefix", "bad_lengths", "reuse"):
            base = (
                [int(t) for t in next(f for f, e in steps if e.step_id == parent_id).split(",")]
                if parent_id and any(e.step_id == parent_id for _, e in steps)
                else []
            )
            prompt = base[: step.prefix_len] + tail if parent_id else tail
            steps.append((",".join(map(str, prompt + completion)), step))
        records.append(step.model_dump_json().encode())
    for session in SESSIONS:
        closing = SessionFinalized(session_id=session, event_time=99.0, reward=0.5)
        records.append(closing.model_dump_json().encode())
    return records


def check(records: list[bytes], max_segment_tokens: int, valid: bool) -> None:
    assembler = Assembler(max_segment_tokens=max_segment_tokens)
    truth = Truth()
    accepted: dict[str, set[str]] = {s: set() for s in SESSIONS}
    closed: dict[str, str] = {}
    segments: list[SegmentFinalized] = []
    notices: list[str] = []  # sessions that closed with a notice instead of a last segment
    for offset, value in enumerate(records):
        applied = assembler.apply(value, 0, offset)  # must not raise, whatever the bytes
        event = applied.event
        if valid:
            assert applied.dead_letter_reason is None, applied.dead_letter_reason
        if isinstance(event, StepRecorded) and not (
            applied.dead_letter_reason or applied.skipped_reason
        ):
            prompt = truth.prompt_of(event)
            assert prompt is not None, "a step placed without a known parent"
            truth.prompts[event.step_id], truth.events[event.step_id] = prompt, event
            accepted[event.session_id].add(event.step_id)
        if isinstance(event, SessionFinalized | SessionDiscarded) and accepted.get(
            event.session_id
        ):  # the close that counts: the first once the session holds a step
            closed.setdefault(event.session_id, event.type)
        segments += applied.segments
        if applied.notice is not None:
            notices.append(applied.notice.session_id)
    assert assembler.counters["assembler_errors"] == 0

    trained: dict[str, int] = {}
    for segment in segments:
        n = len(segment.token_ids)
        assert len(segment.loss_mask) == len(segment.logprobs) == len(segment.logprob_source) == n
        covered = [False] * n
        for entry in segment.steps:
            assert entry.prompt_start <= entry.completion_start <= entry.completion_end <= n
            run = segment.loss_mask[entry.completion_start : entry.completion_end]
            if not any(run):
                continue  # context here (a branch's shared part, carried over at size)
            assert all(run), "a step's completion is partly trainable"
            event = truth.events[entry.step_id]
            assert segment.token_ids[: entry.completion_start] == truth.prompts[entry.step_id]
            assert segment.token_ids[entry.completion_start : entry.completion_end] == list(
                event.completion_ids
            )
            got = segment.logprobs[entry.completion_start : entry.completion_end]
            assert got == list(event.completion_logprobs)
            for p in range(entry.completion_start, entry.completion_end):
                covered[p] = True
            trained[entry.step_id] = trained.get(entry.step_id, 0) + 1
        assert all(c or not m for c, m in zip(covered, segment.loss_mask, strict=True))
    assert all(count == 1 for count in trained.values()), "a sample trainable twice"
    for session in SESSIONS:
        if closed.get(session) != "session_finalized" or not accepted[session]:
            continue
        missing = {s for s in accepted[session] if s not in trained}
        assert not missing, f"accepted samples of {session} never reached a segment: {missing}"
        ends = [s for s in segments if s.session_id == session and s.last_of_session]
        # One end per session: its last segment, or a notice (nothing was left to emit).
        assert len(ends) + notices.count(session) == 1
        if ends:
            ours = [s for s in segments if s.session_id == session]
            assert ours[-1] is ends[0]
            emitted_at_close = [s for s in ours if s.finalize_reason == "finalized"]
            if any(not s.unused_sample for s in emitted_at_close):
                assert not ends[0].unused_sample, "the last of a session is a used segment"


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(traffic(garbage=False), st.sampled_from([0, 0, 6, 12]))
def test_valid_traffic_places_every_sample_once_after_its_true_prompt(
    records: list[bytes], max_segment_tokens: int
) -> None:
    check(records, max_segment_tokens, valid=True)


@FAST
@given(traffic(garbage=True), st.sampled_from([0, 6]))
def test_no_event_sequence_raises_and_every_segment_stays_exact(
    records: list[bytes], max_segment_tokens: int
) -> None:
    check(records, max_segment_tokens, valid=False)

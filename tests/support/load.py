"""A scripted, seeded load for the steps topic, and its fault-free reference segments.

No engine and no ingress: the events are synthetic, but every one is a schema-valid
:class:`~schemas.events.StepRecorded` chained exactly as the ingress chains them (see
``ingress/turns/service.py``): a TITO step names its parent, ``prefix_len`` is the number of tokens
of
the parent (prompt + completion), ``prompt_tail_ids`` are only the new prompt tokens, and it keeps
the parent's ``chain_id``; a ``rendered`` step (first step, or a mid-session cache miss) has no
parent, ``prefix_len == 0``, the whole prompt as its tail and its own id as ``chain_id``; step ids
are derived from (session, parent, tail) by the ingress' own function,
:func:`schemas.events.step_id_for`. Each session ends with a
:class:`~schemas.events.SessionFinalized`.

The same seed always gives the same events, byte for byte (event times are synthetic too).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Literal

from schemas.events import (
    SegmentFinalized,
    SessionFinalized,
    SessionOpened,
    StepRecorded,
    VersionSpan,
    step_id_for,
)
from workers.assembler import Assembler

BASE_TIME = 1_790_000_000.0
VOCAB = 151_000
APIS: tuple[Literal["openai.chat", "anthropic.messages", "openai.responses"], ...] = (
    "openai.chat",
    "anthropic.messages",
    "openai.responses",
)


def _f32(value: float) -> float:
    """``value`` rounded to float32, as an engine reports logprobs."""
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


@dataclass(frozen=True)
class LoadEvent:
    """One record to publish on the steps topic (key = session id)."""

    session_id: str
    value: bytes
    time: float  # position on the synthetic timeline, orders sessions' events when interleaved


@dataclass
class LoadStats:
    sessions: int = 0
    steps: int = 0
    forks: int = 0
    cache_misses: int = 0
    resamples: int = 0
    opened_events: int = 0


@dataclass
class ScriptedLoad:
    events: list[LoadEvent]
    stats: LoadStats
    by_session: dict[str, list[LoadEvent]] = field(default_factory=dict)


@dataclass
class _Step:
    step_id: str
    chain_id: str
    tokens: list[int]  # full prompt + completion
    parent: _Step | None = None
    tail: tuple[int, ...] = ()


def _random_tokens(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(rng.randint(low, high))]


def _session_events(
    rng: random.Random, index: int, stats: LoadStats
) -> list[SessionOpened | StepRecorded | SessionFinalized]:
    session_id = f"fault-session-{index:04d}"
    instance_id = f"fault-instance-{index // 4:03d}"  # four samples per prompt, as GRPO groups
    api = rng.choice(APIS)
    clock = BASE_TIME + index
    events: list[SessionOpened | StepRecorded | SessionFinalized] = []
    if rng.random() < 0.3:
        events.append(
            SessionOpened(
                session_id=session_id,
                event_time=clock,
                instance_id=instance_id,
                metadata={"data_source": "scripted"},
            )
        )
        stats.opened_events += 1
    steps: list[_Step] = []
    head: _Step | None = None
    seen_ids: set[str] = set()
    turns = rng.randint(2, 6)
    for turn in range(turns):
        kind = "tito"
        if head is None:
            kind = "first"
        elif len(steps) >= 2 and rng.random() < 0.18:
            kind = "fork"
        elif head.parent is not None and rng.random() < 0.15:
            kind = "resample"  # the head's prompt again: a client retry, best-of-n
        elif rng.random() < 0.15:
            kind = "cache_miss"
        tail = _random_tokens(rng, 1, 24)
        parent: _Step | None
        if kind == "first":
            tail = _random_tokens(rng, 8, 48)
            parent = None
        elif kind == "cache_miss":
            assert head is not None
            tail = head.tokens + tail  # the whole conversation, rendered: extends the segment
            parent = None
        elif kind == "fork":
            parent = rng.choice([s for s in steps if s is not head])
        elif kind == "resample":
            assert head is not None
            parent, tail = head.parent, list(head.tail)
        else:
            parent = head
        parent_id = parent.step_id if parent else None
        step_id = step_id_for(session_id, parent_id, tail, f"{index}-{turn}")
        assert step_id not in seen_ids, "a scripted step repeats; change the seed"
        seen_ids.add(step_id)
        completion = _random_tokens(rng, 1, 24)
        split = rng.randint(0, len(completion))
        versions = [VersionSpan(version="v1", start=0, end=split)]
        if split < len(completion):
            versions.append(VersionSpan(version="v2", start=split, end=len(completion)))
        clock += rng.uniform(0.1, 5.0)
        events.append(
            StepRecorded(
                session_id=session_id,
                event_time=clock,
                step_id=step_id,
                chain_id=parent.chain_id if parent else step_id,
                parent_step_id=parent_id,
                prefix="tito" if parent else "rendered",
                prefix_len=len(parent.tokens) if parent else 0,
                prompt_tail_ids=tail,
                completion_ids=completion,
                completion_logprobs=[_f32(-rng.expovariate(1.0)) for _ in completion],
                weight_versions=versions,
                finish_reason=rng.choice(["stop", "tool_calls", "length"]),
                instance_id=instance_id,
                turn_id=f"turn-{turn}",
                api=api,
                stream=rng.random() < 0.5,
                model="titoflow-policy",
                engine_url="http://engine.invalid:8000",
                engine_request_id=f"req-{index}-{turn}",
                new_messages=[{"role": "user", "content": f"scripted message {turn}"}],
                response_message={"role": "assistant", "content": f"scripted answer {turn}"},
                render_ms=round(rng.uniform(0.1, 3.0), 3),
                engine_ms=round(rng.uniform(5.0, 500.0), 3),
            )
        )
        base = (parent.tokens if parent else []) + tail
        head = _Step(
            step_id, parent.chain_id if parent else step_id, base + completion, parent, tuple(tail)
        )
        steps.append(head)
        stats.steps += 1
        stats.forks += kind == "fork"
        stats.cache_misses += kind == "cache_miss"
        stats.resamples += kind == "resample"
    clock += rng.uniform(0.1, 2.0)
    events.append(
        SessionFinalized(
            session_id=session_id,
            event_time=clock,
            metadata={"reward": round(rng.uniform(-1.0, 1.0), 4), "turns": turns},
        )
    )
    stats.sessions += 1
    return events


def scripted_load(seed: int, sessions: int = 120) -> ScriptedLoad:
    """``sessions`` multi-turn sessions, interleaved on one synthetic timeline.

    Each session starts at a random moment and spreads its events over a random share of the
    timeline, so many sessions are open at once (commits stay below them) while older ones
    finish; within a session the order is kept, across sessions it is random.
    """
    rng = random.Random(seed)
    stats = LoadStats()
    by_session: dict[str, list[LoadEvent]] = {}
    timeline: list[LoadEvent] = []
    for index in range(sessions):
        events = _session_events(rng, index, stats)
        start = rng.uniform(0.0, 0.8)
        span = rng.uniform(0.05, 0.4)
        moments = sorted(rng.uniform(start, start + span) for _ in events)
        records = [
            LoadEvent(e.session_id, e.model_dump_json().encode(), t)
            for e, t in zip(events, moments, strict=True)
        ]
        by_session[events[0].session_id] = records
        timeline += records
    # Stable sort: a session's events keep their order even on equal moments.
    timeline.sort(key=lambda r: r.time)
    return ScriptedLoad(timeline, stats, by_session)


def reference_segments(load: ScriptedLoad) -> dict[str, bytes]:
    """Fault-free assembly of the load in this process: segment id → its JSON, as workers
    publish it. Only the order within a session matters to the assembler, so one partition and
    running offsets stand in for the topic."""
    assembler = Assembler()
    segments: dict[str, bytes] = {}
    offset = 0
    for records in load.by_session.values():
        for record in records:
            applied = assembler.apply(record.value, partition=0, offset=offset)
            offset += 1
            assert applied.dead_letter_reason is None, applied.dead_letter_reason
            assert applied.skipped_reason is None, applied.skipped_reason
            for segment in applied.segments:
                assert segment.segment_id not in segments, "two segments share an id"
                segments[segment.segment_id] = segment.model_dump_json().encode()
    assert assembler.open_sessions == []
    return segments


def segment_summary(value: bytes) -> str:
    """A short description of a segment for failure messages."""
    segment = SegmentFinalized.model_validate_json(value)
    return (
        f"{segment.segment_id} session={segment.session_id} steps={len(segment.steps)} "
        f"first_step={segment.steps[0].step_id[:8]} tokens={len(segment.token_ids)} "
        f"split={segment.split_reason} mask_ones={sum(segment.loss_mask)}"
    )

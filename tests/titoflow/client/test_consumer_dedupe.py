"""The trainer's dedupe across restarts (titoflow/client/dedupe.py), on a simulated partition.

A partition log holds first copies and repeats; a repeat's first copy is at most the horizon
older than the newest record up to the repeat (what a worker's redelivery guarantees, measured
on the records' timestamps). A consumer is restarted at arbitrary offsets; each life knows only
what it reads back from the tail before its start, as ``SegmentConsumer`` does against a broker
(whose ListOffsets-by-time answer is the first offset stamped at or after a time).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from titoflow.client.dedupe import SeenIds, tail_cutoff_ms

HORIZON_MS = 1000


@dataclass(frozen=True)
class Record:
    key: str
    timestamp_ms: int


def first_offset_at_or_after(log: list[Record], timestamp_ms: int) -> int | None:
    """The broker's answer to ListOffsets with a timestamp."""
    return next((i for i, r in enumerate(log) if r.timestamp_ms >= timestamp_ms), None)


def consume(log: list[Record], restarts: list[int], horizon_ms: int) -> list[str]:
    """What a consumer restarted at each offset of ``restarts`` delivers, life after life."""
    delivered: list[str] = []
    starts = [0, *restarts]
    for start, end in zip(starts, [*restarts, len(log)], strict=True):
        seen = SeenIds(horizon_ms)
        if start < len(log):
            cutoff = tail_cutoff_ms(log[start].timestamp_ms, horizon_ms)
            tail = first_offset_at_or_after(log, cutoff)
            for record in log[tail if tail is not None and tail < start else start : start]:
                seen.first_time(record.key, record.timestamp_ms)
        delivered += [r.key for r in log[start:end] if seen.first_time(r.key, r.timestamp_ms)]
    return delivered


@st.composite
def partition_logs(draw: st.DrawFn) -> list[Record]:
    """First copies and repeats, timestamps rising with a producer-clock jitter."""
    log: list[Record] = []
    firsts: dict[str, int] = {}
    clock = newest = 0
    for is_repeat, pick, step_ms, jitter_ms in draw(
        st.lists(
            st.tuples(
                st.booleans(),
                st.integers(0, 10**6),
                st.integers(0, HORIZON_MS // 2),
                st.integers(0, HORIZON_MS // 4),
            ),
            max_size=60,
        )
    ):
        clock += step_ms
        stamp = clock - jitter_ms
        newest = max(newest, stamp)
        repeatable = sorted(k for k, t in firsts.items() if t >= newest - HORIZON_MS)
        if is_repeat and repeatable:
            key = repeatable[pick % len(repeatable)]
        else:
            key = f"s{len(firsts)}"
            firsts[key] = stamp
        log.append(Record(key, stamp))
    return log


@given(partition_logs(), st.data())
def test_restarts_anywhere_deliver_each_id_once(log: list[Record], data: st.DataObject) -> None:
    restarts = sorted(data.draw(st.sets(st.integers(1, max(1, len(log))), max_size=8)))
    delivered = consume(log, restarts, HORIZON_MS)
    firsts = list(dict.fromkeys(r.key for r in log))
    assert delivered == firsts


@given(partition_logs())
def test_memory_holds_about_one_horizon(log: list[Record]) -> None:
    seen = SeenIds(HORIZON_MS)
    newest = 0
    for i, record in enumerate(log):
        seen.first_time(record.key, record.timestamp_ms)
        newest = max(newest, record.timestamp_ms)
        # Everything older than the horizon is gone, except what sits behind a younger record
        # logged before it (a clock's jitter): at most the records since the oldest one kept.
        oldest_kept = next(j for j, r in enumerate(log) if r.timestamp_ms >= newest - HORIZON_MS)
        assert len(seen) <= len({r.key for r in log[oldest_kept : i + 1]})


def test_a_repeat_beyond_the_horizon_is_delivered_again() -> None:
    """The bound is the horizon: a repeat older than that is not recognised (why the horizon
    must exceed the longest rollout plus a worker failover, docs/trainer.md)."""
    log = [Record("a", 0), Record("b", HORIZON_MS + 1), Record("a", HORIZON_MS + 1)]
    assert consume(log, [], HORIZON_MS) == ["a", "b", "a"]
    assert consume(log, [], 2 * HORIZON_MS) == ["a", "b"]
    assert consume(log, [2], 2 * HORIZON_MS) == ["a", "b"]

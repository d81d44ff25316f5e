"""What to replay: which partitions, from where, which sessions, and what to do with sessions
still open at the end; and the command-line forms of offsets and times.

Invariant: a start is resolved per partition by one precedence: ``from_offsets[p]``, else
``from_offset``, else ``from_time``, else the beginning (see :meth:`ReplayOptions.starts_by_time`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from workers.replay.errors import ReplayError


@dataclass(frozen=True)
class ReplayOptions:
    """Which records to replay and what to do with sessions still open at the end.

    Start: ``from_offsets[p]`` for the partitions it names, else ``from_offset`` for every
    partition, else ``from_time`` (unix seconds, by record timestamp), else the beginning.
    Offsets are clamped to what the log still holds.
    """

    partitions: frozenset[int] | None = None
    from_offset: int | None = None
    from_offsets: dict[int, int] = field(default_factory=dict)
    from_time: float | None = None
    session: str | None = None
    instance: str | None = None
    finalize_open: bool = False

    def starts_by_time(self, partition: int) -> bool:
        return (
            self.from_time is not None
            and self.from_offset is None
            and partition not in self.from_offsets
        )


def parse_from_offsets(values: Sequence[str]) -> tuple[int | None, dict[int, int]]:
    """``["100", "3:50"]`` → every partition from 100, partition 3 from 50."""
    every: int | None = None
    per_partition: dict[int, int] = {}
    for value in values:
        partition, sep, offset = value.partition(":")
        try:
            if sep:
                per_partition[int(partition)] = int(offset)
            else:
                every = int(partition)
        except ValueError:
            raise ReplayError(f"--from-offset {value!r}: expected N or PARTITION:N") from None
    if any(o < 0 for o in [*per_partition.values(), every or 0]):
        raise ReplayError("--from-offset must not be negative")
    return every, per_partition


def parse_time(value: str, flag: str = "--from-time") -> float:
    """Unix seconds (``1795271354.5``) or ISO 8601 (``2026-11-21T14:29:18Z``; naive = UTC)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ReplayError(f"{flag} {value!r}: expected unix seconds or ISO 8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()

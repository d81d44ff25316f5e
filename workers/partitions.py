"""Which steps partitions a worker reads, and where it is in each: the read bound of a rebalance.

Invariants (plain bookkeeping: no Kafka, no clocks; the worker feeds it what its consumer says):
- A record is applied only under the assignment it was read for: its partition is held, and it is
  the next offset after the last one applied there, reading having begun at the position the
  consumer started the assignment at (the committed bound). A record fetched under an earlier
  assignment and handed over after a revocation, or after the partition came back, is not the next
  offset of the new reading (or its partition is not held): it is never applied, so the worker's
  sessions are always built from the bound on, never from a tail of them.
- Offsets are only ever to be committed for held partitions, up to the next offset applied there.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(Enum):
    """What to do with a record of the steps topic."""

    APPLY = "apply"  # the next offset of a held partition
    NOT_HELD = "not_held"  # its partition was revoked (or its assignment is not yet known)
    READ = "read"  # below the next offset: applied already in this reading (a stale fetch)
    GAP = "gap"  # above the next offset: records between were never applied


@dataclass
class Reading:
    """One assignment of one partition: the next offset to apply."""

    next: int
    sent_back_at: int | None = None  # the next offset the consumer was last sent back to


class PartitionLedger:
    def __init__(self) -> None:
        self._readings: dict[int, Reading] = {}

    def assign(self, partition: int, position: int) -> None:
        """A new reading of ``partition`` from ``position`` (the consumer's start: the bound)."""
        self._readings[partition] = Reading(position)

    def revoke(self, partitions: list[int]) -> None:
        for partition in partitions:
            self._readings.pop(partition, None)

    def held(self) -> list[int]:
        return list(self._readings)

    def reading(self, partition: int) -> Reading | None:
        return self._readings.get(partition)

    def verdict(self, partition: int, offset: int) -> Verdict:
        reading = self._readings.get(partition)
        if reading is None:
            return Verdict.NOT_HELD
        if offset < reading.next:
            return Verdict.READ
        return Verdict.APPLY if offset == reading.next else Verdict.GAP

    def applied(self, partition: int, offset: int) -> None:
        """``offset`` of ``partition`` was applied (its verdict was APPLY)."""
        self._readings[partition].next = offset + 1

    def skip_to(self, partition: int, offset: int) -> None:
        """Records below ``offset`` are gone (retention deleted them): read on from there."""
        self._readings[partition].next = offset

    def next_offsets(self) -> dict[int, int]:
        """The next offset to apply, per held partition (what a commit may go up to)."""
        return {partition: reading.next for partition, reading in self._readings.items()}

"""How far a reader of the segments topic that holds records back (in an open group, a partly
filled packed row) may commit, and what it must skip when it resumes.

Per partition, a record read is *held* until it is *released*: handed to the caller in an item,
or dropped as nothing to train on. Groups complete out of order, so a partition's released
records are not a prefix of what was read.

Invariants: the watermark of a partition is its lowest held offset, else one past the last
offset read; it never passes a held record, and never decreases while each partition is read in
order. Released records at or above the watermark are remembered as *done*; a reader resumed from
:meth:`Progress.checkpoint` re-reads each partition from its watermark and skips exactly the done
offsets there, so every record is handed out once across restarts: a record held at the
checkpoint comes again, a released one does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# (partition, offset) of a record.
Position = tuple[int, int]


class Progress:
    def __init__(self, resume: Mapping[str, Any] | None = None) -> None:
        """``resume``: a :meth:`checkpoint` (as saved in JSON: partition keys may be strings)."""
        self._read: dict[int, int] = {}  # partition → one past the last offset read
        self._held: dict[int, set[int]] = {}
        self._done: dict[int, set[int]] = {}  # released, at or above the watermark
        for partition, offset in (resume or {}).get("offsets", {}).items():
            self._read[int(partition)] = int(offset)
        for partition, offsets in (resume or {}).get("done", {}).items():
            self._done[int(partition)] = {int(o) for o in offsets}

    def read(self, partition: int, offset: int) -> bool:
        """Take the record at ``(partition, offset)``: held until released, or False when it was
        done before the resume (skip it: its item was handed out then)."""
        self._read[partition] = max(self._read.get(partition, 0), offset + 1)
        if offset in self._done.get(partition, ()):
            self._forget_below_watermark(partition)
            return False
        self._held.setdefault(partition, set()).add(offset)
        return True

    def release(self, positions: Iterable[Position]) -> None:
        """The records at ``positions`` are handed out (or need nothing): done."""
        touched: set[int] = set()
        for partition, offset in positions:
            self._held[partition].remove(offset)
            self._done.setdefault(partition, set()).add(offset)
            touched.add(partition)
        for partition in touched:
            self._forget_below_watermark(partition)

    def watermark(self) -> dict[int, int]:
        """Partition → the offset to commit: everything below it is released."""
        return {partition: self._mark(partition) for partition in self._read}

    def checkpoint(self) -> dict[str, Any]:
        """JSON-able: the watermark and the done offsets above it, to resume from."""
        return {
            "offsets": {str(p): o for p, o in sorted(self.watermark().items())},
            "done": {str(p): sorted(d) for p, d in sorted(self._done.items()) if d},
        }

    def _mark(self, partition: int) -> int:
        return min(self._held.get(partition) or (), default=self._read[partition])

    def _forget_below_watermark(self, partition: int) -> None:
        # Nothing below the watermark is read again: its done offsets are no longer needed.
        mark = self._mark(partition)
        done = self._done.get(partition)
        if done and min(done) < mark:
            self._done[partition] = {o for o in done if o >= mark}

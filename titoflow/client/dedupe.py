"""The ids one partition of the segments topic has shown, over a time horizon.

Invariant: an id is new once. It stays known while its record's timestamp is within
``horizon_ms`` of the newest record seen on the partition (a repeat is published at most that
long after the first copy: docs/trainer.md "Delivery and restarts"), so memory holds one horizon
of ids, and a consumer that starts mid-partition knows every id a repeat at its start could carry
by reading back the records from :func:`tail_cutoff_ms` on (:mod:`titoflow.client.consumer`).
"""

from __future__ import annotations

from collections import OrderedDict


def tail_cutoff_ms(first_timestamp_ms: int, horizon_ms: int) -> int:
    """The oldest timestamp a record may have and still hold the first copy of a repeat that a
    consumer meets at or after a record stamped ``first_timestamp_ms``."""
    return first_timestamp_ms - horizon_ms


class SeenIds:
    def __init__(self, horizon_ms: int) -> None:
        self._horizon_ms = horizon_ms
        self._ids: OrderedDict[str, int] = OrderedDict()  # id → timestamp, in log order
        self._newest_ms: int | None = None

    def first_time(self, key: str, timestamp_ms: int) -> bool:
        """Whether ``key`` is new; a new key is remembered, stamped ``timestamp_ms``."""
        if self._newest_ms is None or timestamp_ms > self._newest_ms:
            self._newest_ms = timestamp_ms
        self._forget_older_than(self._newest_ms - self._horizon_ms)
        if key in self._ids:
            return False
        self._ids[key] = timestamp_ms
        return True

    def _forget_older_than(self, cutoff_ms: int) -> None:
        # Log order is nearly time order (producers' clocks): a record out of order only stays
        # until those logged before it are gone, which errs on remembering.
        while self._ids:
            key, stamped = next(iter(self._ids.items()))
            if stamped >= cutoff_ms:
                return
            del self._ids[key]

    def __len__(self) -> int:
        return len(self._ids)

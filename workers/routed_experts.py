"""A segment's routed experts (MoE routing replay), assembled from its steps' rows.

Segment positions are the positions of every step's own token sequence (a segment only ever
extends a prefix its steps share), so a step's rows land at their own positions. Rows form one
run from the first position any step covered: where several steps cover a position the first
one wins (what the engine's prefix cache also reuses), and a step whose rows start past the run's
end (an earlier step brought none) is left out, so the run stops there and says so by its length.
"""

from __future__ import annotations

from schemas.routed_experts import RoutedExperts


class SegmentRouting:
    def __init__(self, block: RoutedExperts | None = None) -> None:
        self._reset(block)

    def _reset(self, block: RoutedExperts | None) -> None:
        self._layout = block.layout() if block else None
        self._start = block.start if block else 0
        self._data = bytearray(block.data if block else b"")
        self._row_bytes = block.row_bytes if block else 0

    @property
    def end(self) -> int:
        return self._start + (len(self._data) // self._row_bytes if self._row_bytes else 0)

    def add(self, rows: RoutedExperts | None) -> None:
        if rows is None:
            return
        if self._layout is None:
            self._reset(rows)
            return
        if rows.layout() != self._layout or rows.start > self.end:
            return  # another model's rows, or a gap: the run ends where it is
        new = rows.between(self.end, rows.end)
        if new is not None:
            self._data += new.data

    def truncate(self, positions: int) -> None:
        """Keep rows of positions below ``positions`` (a segment cut back to fewer steps)."""
        if self._layout is None:
            return
        keep = max(positions - self._start, 0)
        del self._data[keep * self._row_bytes :]
        if not self._data:
            self._reset(None)

    def copy(self) -> SegmentRouting:
        return SegmentRouting(self.block())

    def block(self) -> RoutedExperts | None:
        if self._layout is None:
            return None
        layers, top_k, dtype = self._layout
        rows = len(self._data) // self._row_bytes
        return RoutedExperts.model_validate(
            {
                "start": self._start,
                "shape": (rows, layers, top_k),
                "dtype": dtype,
                "data": bytes(self._data),
            }
        )

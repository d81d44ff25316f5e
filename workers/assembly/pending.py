"""Which logprobs of a finished segment the recompute stage has yet to fill in.

Invariant: a position is pending exactly when its source is ``recomputed`` and its logprob is
NaN (what :func:`workers.rebuild.relabel` writes), so a pending token is never taken for a
scored one, and a segment with none goes straight to the segments topic.
"""

from __future__ import annotations

import math

from schemas.events import LOGPROB_SOURCE_RECOMPUTED, SegmentFinalized


def pending_positions(segment: SegmentFinalized) -> list[int]:
    """Positions whose logprobs the recompute stage has yet to fill in (source 3, NaN)."""
    return [
        p
        for p, (source, logprob) in enumerate(
            zip(segment.logprob_source, segment.logprobs, strict=True)
        )
        if source == LOGPROB_SOURCE_RECOMPUTED and math.isnan(logprob)
    ]


def needs_recompute(segment: SegmentFinalized) -> bool:
    # The C-level membership test spares almost every segment the per-position scan.
    return LOGPROB_SOURCE_RECOMPUTED in segment.logprob_source and bool(pending_positions(segment))

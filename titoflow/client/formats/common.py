"""What several trainer formats read off a segment the same way.

Invariant: the prompt of a segment is everything before its first step's completion (context,
loss mask 0); the response is the rest, generated tokens and the tool results and later turns
between them (whose loss mask is 0), as agent frameworks lay out multi-turn samples. A
segment's images are never dropped silently: a converter carries them or refuses the segment.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.events import SegmentFinalized


def prompt_length(segment: SegmentFinalized) -> int:
    """Tokens before the first generated one (the whole segment if it has no step)."""
    return segment.steps[0].completion_start if segment.steps else len(segment.token_ids)


def truncated(segment: SegmentFinalized) -> bool:
    """The last step stopped at its token limit."""
    return bool(segment.steps) and segment.steps[-1].finish_reason == "length"


def versions(segment: SegmentFinalized) -> list[str]:
    """The weight versions that sampled the segment, in token order, each once."""
    return list(dict.fromkeys(span.version for span in segment.weight_versions))


def refuse_images(segments: Iterable[SegmentFinalized], why: str) -> None:
    """ValueError for the first segment holding images, saying ``why`` they cannot go along."""
    for segment in segments:
        if segment.images:
            raise ValueError(
                f"segment {segment.segment_id} holds {len(segment.images)} images: {why}"
            )

"""Segments from a file: the JSONL that ``titoflow replay`` writes (one event per line, the bytes
the live worker publishes), streamed.

Invariant: each line is validated as an event of the segments topic (a segment or a discard
notice) and yielded once: a repeat of a segment id already read (replays repeat them) is
dropped; a line that is not such an event is an error naming the file and line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from schemas.events import SegmentFinalized, SessionDiscarded, segments_topic_adapter


def read_jsonl(path: str | Path) -> Iterator[SegmentFinalized | SessionDiscarded]:
    """The events of a JSONL file of segments, in file order, repeats dropped."""
    seen: set[str] = set()
    with open(path, "rb") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                event = segments_topic_adapter.validate_json(line)
            except ValidationError as exc:
                raise ValueError(f"{path}:{number}: not a segments-topic event: {exc}") from exc
            key = (
                event.segment_id
                if isinstance(event, SegmentFinalized)
                else f"discarded:{event.session_id}"
            )
            if key not in seen:
                seen.add(key)
                yield event

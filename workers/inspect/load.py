"""Segments read from JSON (a file of ``segment_finalized`` events, or one record's value).

Invariants:
- A segment keeps its raw JSON beside the model, so fields this schema version does not know
  yet are still shown.
- Each segment id is kept once, the first seen (replays re-emit segments); a line of a file
  that is not a segment is an error naming the line, never skipped in silence.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from schemas.events import SegmentFinalized
from workers.inspect.view import Loaded


def parse_segment(raw_bytes: bytes | str) -> Loaded:
    raw = json.loads(raw_bytes)
    if not isinstance(raw, dict):
        raise ValueError("a segment must be a JSON object")
    return Loaded(SegmentFinalized.model_validate(raw), raw)


def select(
    loaded: Iterable[Loaded], session: str | None = None, segment_id: str | None = None
) -> list[Loaded]:
    """Matching segments, the first of each segment id (replays repeat them)."""
    seen: set[str] = set()
    out = []
    for item in loaded:
        s = item.segment
        if session is not None and s.session_id != session:
            continue
        if segment_id is not None and s.segment_id != segment_id:
            continue
        if s.segment_id in seen:
            continue
        seen.add(s.segment_id)
        out.append(item)
    return out


def load_jsonl(
    path: Path, session: str | None = None, segment_id: str | None = None
) -> list[Loaded]:
    """Segments from a JSONL file (``-``: stdin); lines that are not segments are errors."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    loaded = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            loaded.append(parse_segment(line))
        except (ValueError, ValidationError) as exc:
            raise ValueError(f"{path}:{number}: not a segment_finalized event: {exc}") from exc
    return select(loaded, session, segment_id)

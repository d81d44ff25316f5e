"""What a token is, for display: the classes both renderers (terminal and HTML) colour by.

Invariant: a piece is styled by its last token (the one that completes its text), and a
generated token (loss mask 1) without a logprob source is an anomaly, which the terminal and
HTML views both show as one: a missing logprob is never passed off as a value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import schemas.events as events
from workers.inspect.decode import Piece
from workers.inspect.view import SegmentView, source_name, source_names


@dataclass(frozen=True)
class TokenStyle:
    mask: int
    source: str
    anomaly: bool  # generated (mask 1) but no logprob source: a silent zero
    version: int | None  # index into the segment's version names
    special: bool


def style_of(view: SegmentView, piece: Piece, versions: list[str]) -> TokenStyle:
    last = piece.end - 1
    segment = view.segment
    mask = segment.loss_mask[last]
    code = segment.logprob_source[last]
    version = view.versions[last]
    return TokenStyle(
        mask=mask,
        source=source_name(code),
        anomaly=bool(mask) and code == events.LOGPROB_SOURCE_NONE,
        version=versions.index(version) if version is not None else None,
        special=piece.special,
    )


def elide(pieces: list[Piece], keep: int | None) -> tuple[list[Piece], list[Piece], int]:
    """First and last ``keep`` pieces and how many tokens lie between (``keep=None``: all)."""
    if keep is None or len(pieces) <= 2 * keep:
        return pieces, [], 0
    head, tail = pieces[:keep], pieces[len(pieces) - keep :]
    hidden = tail[0].start - head[-1].end if head else tail[0].start - pieces[0].start
    return head, tail, hidden


SOURCE_MEANING = {
    "sampled": "the engine's logprob of the token it sampled",
    "constrained": "sampled under constrained decoding (a forced tool call)",
    "recomputed": "recomputed with the engine's prompt logprobs after a divergence",
}


def generated_sources() -> list[str]:
    """Every source a generated token can have, for legends (known ones first)."""
    names = [n for n in source_names().values() if n != "none"]
    return [n for n in SOURCE_MEANING if n in names] + sorted(set(names) - set(SOURCE_MEANING))


def fmt(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

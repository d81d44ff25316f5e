"""Token ids → the text pieces ``titoflow inspect`` shows, with the policy's tokenizer.

Invariants:
- Pieces cover the asked range exactly, in order, none crossing its ends: every token is shown
  once, and a step's context and completion never share a piece.
- Special and added tokens are shown as themselves, one piece each; byte-level tokens that only
  together form a character (at most four: a UTF-8 character's bytes) are one piece. Nothing
  is re-encoded.
- Without a tokenizer each token is its id, ``⟨id⟩``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Tokens decoded before a piece, so merges and leading spaces decode as in the full text.
_WINDOW = 6
# A UTF-8 character has at most 4 bytes: byte-level tokens of one character merge into one piece.
_MAX_MERGE = 4


@dataclass(frozen=True)
class Piece:
    """Text of tokens ``[start, end)`` of a segment: one token, or the few tokens of one
    character that a byte-level vocabulary split."""

    text: str
    start: int
    end: int
    special: bool = False


class TokenDecoder:
    """Per-token text from a Hugging Face tokenizer (or ``⟨id⟩`` without one)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self._tokenizer = tokenizer
        self.special_ids: set[int] = set()
        if tokenizer is not None:
            self.special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
            self.special_ids |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        assert self._tokenizer is not None
        text = self._tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return str(text)

    def pieces(self, ids: Sequence[int], start: int, end: int) -> list[Piece]:
        """Pieces covering ``ids[start:end]``, none crossing ``start`` or ``end``."""
        if self._tokenizer is None:
            return [Piece(f"⟨{ids[i]}⟩", i, i + 1) for i in range(start, end)]
        out: list[Piece] = []
        at = start
        while at < end:
            if ids[at] in self.special_ids:
                out.append(Piece(self._decode([ids[at]]), at, at + 1, special=True))
                at += 1
                continue
            context = max(0, at - _WINDOW)
            seen = self._decode(ids[context:at])
            stop = at + 1
            text = self._decode(ids[context:stop])
            while (
                text.endswith("\ufffd")
                and stop < end
                and stop - at < _MAX_MERGE
                and ids[stop] not in self.special_ids
            ):
                stop += 1
                text = self._decode(ids[context:stop])
            piece = text[len(seen) :] if text.startswith(seen) else self._decode(ids[at:stop])
            out.append(Piece(piece, at, stop))
            at = stop
        return out

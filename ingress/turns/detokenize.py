"""Incremental detokenization: text deltas from token ids as they stream in.

Decoding each new token alone breaks multi-byte characters and merged spaces, and decoding the
whole completion every time is quadratic; like vLLM, decode a short window behind the last
emitted position and hold back an incomplete character (U+FFFD at the end).
"""

from __future__ import annotations

from typing import Protocol

_WINDOW = 6  # tokens decoded before the unread ones, enough for byte-level BPE merges


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDecoder:
    def __init__(self, decoder: Decoder, special_tokens: bool = False) -> None:
        self._decoder = decoder
        self._skip_special = not special_tokens  # a family whose markers are special tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0  # end of what was already emitted

    def push(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        window = self._ids[self._prefix_offset :]
        seen = self._decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._decode(window)
        if text.endswith("\ufffd") or len(text) <= len(seen):
            return ""  # an incomplete character: wait for its next bytes
        self._prefix_offset = max(self._read_offset, len(self._ids) - _WINDOW)
        self._read_offset = len(self._ids)
        return text[len(seen) :]

    def flush(self) -> str:
        """Whatever is still held back (a truly incomplete character at the very end)."""
        seen = self._decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._decode(self._ids[self._prefix_offset :])
        self._read_offset = len(self._ids)
        return text[len(seen) :]

    def _decode(self, ids: list[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip_special) if ids else ""


class StopTrimmer:
    """Cuts visible text at the first stop string, as the APIs promise. The engine stops on the
    token that completes a stop string, and that token may carry text past it; while streaming,
    text that could still begin a stop string is held back until it cannot."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped or not self._stops:
            return "" if self.stopped else text
        self._pending += text
        cuts = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        if cuts:
            self.stopped = True
            out, self._pending = self._pending[: min(cuts)], ""
            return out
        keep = max(0, len(self._pending) - self._hold)
        out, self._pending = self._pending[:keep], self._pending[keep:]
        return out

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out

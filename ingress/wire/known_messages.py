"""Messages already parsed, by their wire bytes: a re-sent history is validated once per replica.

A chat client sends the whole conversation on every call, so validating it costs time in proportion
to its length, most of it for messages the replica parsed the turn before (docs/benchmarks.md §1–2,
§9). Parsing a message is a pure function of its JSON, so a message whose bytes (``orjson.dumps`` of
the decoded value: ``1``, ``1.0`` and ``true`` stay distinct, unlike under ``==``; bodies hold no
NaN, see ``http.read_json``) were seen before gets the messages parsed from them then. Only the new
ones are validated, in one call.

The same bytes tell a text-only turn (:meth:`KnownMessages.parse_turn`): every image a message
can hold is a content part whose type names ``image`` (OpenAI's ``image_url``, Anthropic's
``image``), and orjson writes letters as they are, never escaped; so a history none of whose
keys holds ``image`` holds no image, known without a pass over its messages (in a busy replica
each of them is a cache miss again: docs/benchmarks.md §4h).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, NamedTuple, cast

import orjson

from titoflow.tito.messages import Message

Parsed = tuple[Message, ...]  # what one wire message becomes (Anthropic blocks can make several)
ParseNew = Callable[[list[tuple[int, Any]]], list[Parsed]]


class KnownTurn(NamedTuple):
    """A turn's wire messages, parsed."""

    messages: tuple[Message, ...]
    text_only: bool  # no message holds an image (False: it may)


class KnownMessages:
    """Bounded by the bytes of its keys (the parsed messages are mostly shared with the chains
    of the session cache), in two generations: new messages go to the young one, which becomes
    the old one (the old one dropped) once it holds half the bound; a message found in the old
    one moves back to the young. A history re-sent within a generation's span is kept, one not
    seen for two is gone. Per-message LRU bookkeeping cost more than the lookups it guarded;
    this way a known history is found by ``dict.get`` mapped over its keys."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._young: dict[str, dict[bytes, Parsed]] = {}  # by API: the same bytes parse apart
        self._old: dict[str, dict[bytes, Parsed]] = {}
        self._young_bytes = 0
        self._old_bytes = 0

    @property
    def size(self) -> int:
        """Bytes of the keys held."""
        return self._young_bytes + self._old_bytes

    def parse_turn(self, api: str, raw_messages: Sequence[Any], parse_new: ParseNew) -> KnownTurn:
        """:meth:`parse`'s messages in one tuple, and whether they are text only."""
        keys = _keys(raw_messages)
        parsed = self._parse(api, raw_messages, parse_new, keys)
        text_only = all(keys) and not any(map(_names_image, keys))
        return KnownTurn(tuple(chain.from_iterable(parsed)), text_only)

    def parse(self, api: str, raw_messages: Sequence[Any], parse_new: ParseNew) -> list[Parsed]:
        """Each of ``raw_messages`` parsed; ``parse_new`` gets the (index, raw message) pairs not
        seen before and returns theirs in that order (its errors propagate, nothing is kept)."""
        return self._parse(api, raw_messages, parse_new, _keys(raw_messages))

    def _parse(
        self, api: str, raw_messages: Sequence[Any], parse_new: ParseNew, keys: list[bytes]
    ) -> list[Parsed]:
        young = self._young.setdefault(api, {})
        found: list[Parsed | None] = list(map(young.get, keys))
        if None not in found:
            return cast(list[Parsed], found)
        old = self._old.get(api, {})
        new: list[int] = []
        for index, parsed in enumerate(found):
            if parsed is not None:
                continue
            parsed = old.get(keys[index])
            if parsed is None:
                new.append(index)
            else:
                found[index] = parsed
                self._keep(api, keys[index], parsed)
        if new:
            parsed_new = parse_new([(index, raw_messages[index]) for index in new])
            for index, parsed in zip(new, parsed_new, strict=True):
                found[index] = parsed
                self._keep(api, keys[index], parsed)
        return cast(list[Parsed], found)  # every None was filled above

    def _keep(self, api: str, key: bytes, parsed: Parsed) -> None:
        if not key:  # beyond orjson: not kept
            return
        young = self._young.setdefault(api, {})
        if key in young:
            return
        if self._young_bytes + len(key) > self.max_bytes // 2:
            self._old, self._old_bytes = self._young, self._young_bytes
            self._young, self._young_bytes = {}, 0
            young = self._young.setdefault(api, {})
        # A copy of exactly its length: orjson's output keeps its whole write buffer, which would
        # make the bound a fraction of the memory the keys take (docs/benchmarks.md §5).
        young[memoryview(key).tobytes()] = parsed
        self._young_bytes += len(key)


def _keys(raw_messages: Sequence[Any]) -> list[bytes]:
    """Each message's JSON bytes; empty for one orjson refuses (integers over 64 bits...), which
    is then parsed every time (no message's JSON is empty)."""
    try:
        return list(map(orjson.dumps, raw_messages))
    except TypeError:
        return [_key(raw) for raw in raw_messages]


def _names_image(key: bytes) -> bool:
    return b"image" in key


def _key(raw: Any) -> bytes:
    try:
        return orjson.dumps(raw)
    except TypeError:
        return b""


# One per process, shared by the adapters (keys are kept per API). 64 MiB of keys hold about
# 2,400 histories of the overhead benchmark's turn 50; the frozen messages they map to add at
# most as much again, for sessions the chain cache no longer holds.
KNOWN_MESSAGES = KnownMessages(max_bytes=64 << 20)

"""Messages already parsed, by their wire bytes: a re-sent history is validated once per replica.

A chat client sends the whole conversation on every call, so validating it costs time in
proportion to its length: at turn 50 of ``bench/overhead.py`` (102 messages, 27 KB) parsing the
OpenAI request took 0.51 ms, 0.45 of it for messages the replica had parsed the turn before.
Parsing a message is a pure function of its JSON, so a message whose bytes (``orjson.dumps`` of
the decoded value: ``1``, ``1.0`` and ``true`` stay distinct, unlike under ``==``) were seen
before gets the messages parsed from them then. Only the new ones are validated, in one call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ingress.turn import Message

Parsed = tuple[Message, ...]  # what one wire message becomes (Anthropic blocks can make several)
ParseNew = Callable[[list[tuple[int, Any]]], list[Parsed]]


class KnownMessages:
    """Bounded by the bytes of its keys (the parsed messages are mostly shared with the chains
    of the session cache); least recently used out first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._parsed: OrderedDict[bytes, Parsed] = OrderedDict()

    def parse(self, api: str, raw_messages: Sequence[Any], parse_new: ParseNew) -> list[Parsed]:
        """Each of ``raw_messages`` parsed; ``parse_new`` gets the (index, raw message) pairs not
        seen before and returns theirs in that order (its errors propagate, nothing is kept)."""
        prefix = api.encode() + b"\0"
        keys = [_key(prefix, raw) for raw in raw_messages]
        found: list[Parsed | None] = []
        for key in keys:
            parsed = None
            if key is not None:
                parsed = self._parsed.get(key)
                if parsed is not None:
                    self._parsed.move_to_end(key)
            found.append(parsed)
        new = [(i, raw_messages[i]) for i, parsed in enumerate(found) if parsed is None]
        if new:
            for (index, _), parsed in zip(new, parse_new(new), strict=True):
                found[index] = parsed
                key = keys[index]
                if key is not None and key not in self._parsed:
                    self._parsed[key] = parsed
                    self.size += len(key)
            while self.size > self.max_bytes and self._parsed:
                evicted, _ = self._parsed.popitem(last=False)
                self.size -= len(evicted)
        return [parsed for parsed in found if parsed is not None]


def _key(prefix: bytes, raw: Any) -> bytes | None:
    try:
        return prefix + orjson.dumps(raw)
    except TypeError:  # beyond orjson (integers over 64 bits...): parsed every time
        return None


# One per process, shared by the adapters (keys carry the API). 64 MiB of keys hold about 2,400
# histories of the overhead benchmark's turn 50; the frozen messages they map to add at most as
# much again, for sessions the chain cache no longer holds.
KNOWN_MESSAGES = KnownMessages(max_bytes=64 << 20)

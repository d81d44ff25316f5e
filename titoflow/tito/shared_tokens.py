"""Token sequences that share their storage with the sequence they extend: a chain's prompt and
its next head are its parent's tokens plus a tail, made without copying the parent's tokens.

Copying them cost every turn time and memory traffic in proportion to the conversation (a
47k-token chain is a 190 KB array, and so many bytes of allocation go through mmap and page
faults); sharing makes a turn's extension cost its own tail's length.

Invariants:
- A :class:`SharedTokens` is immutable: its ids are the first ``len`` ids of its store, and a
  store never writes an id it holds again (append-only). Any number of sequences, of any
  lengths, share one store.
- Extending a sequence writes into its store only past the store's end, and only where the
  store's ids past the sequence are a prefix of the tail or the tail a prefix of them (the
  sequence's first extension; a retry with the same tail, which reuses the ids written). Any
  other extension (a fork: the store went on with other ids) copies the sequence into a new
  store. So every sequence reads exactly the ids a plain copy would hold.
- A store appends to its ``array`` in place (the array's own growth: realloc, about a 16th of
  room). An ``array`` cannot be resized while it exports its buffer (a memoryview, a numpy view
  of a prompt being sent): then the store swaps in a longer copy instead, and the view keeps the
  old array, whose ids are the same.
- One lock per store makes check-and-write atomic: prompts are built in worker threads too
  (``PromptBuilder.for_turn``), and two requests may extend one parent at once. Reads take no
  lock: the ids they read are never written again, the same in every array the store held.

Memory: a chain's tokens are packed int32, as a plain array's (4 bytes a token and the array's
room to grow); the ids of a store no sequence reaches any more (a failed call's prompt) stay
until the store goes.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload


class _Store:
    __slots__ = ("ids", "lock")

    def __init__(self, ids: array[int]) -> None:
        self.ids = ids
        self.lock = threading.Lock()

    def write(self, at: int, tail: array[int]) -> bool:
        """Make ``tail`` the ids from ``at`` on, if the ids already there allow it; under the
        lock. False: they are other ids (a fork)."""
        with self.lock:
            ids = self.ids
            known = min(len(ids), at + len(tail)) - at
            if known < 0 or (known and ids[at : at + known] != tail[:known]):
                return False
            rest = tail[known:] if known else tail
            if rest:
                try:
                    ids.extend(rest)
                except BufferError:  # a view of the array is out: it keeps the old one
                    self.ids = ids + rest
            return True


class SharedTokens(Sequence[int]):
    """An immutable sequence of token ids (int32) that shares its storage with the sequences it
    extends and that extend it; ``+`` extends, :meth:`prefix` cuts, neither copies the ids
    before the cut."""

    __slots__ = ("_len", "_store")

    def __init__(self, store: _Store, length: int) -> None:
        self._store = store
        self._len = length

    @classmethod
    def of(cls, ids: Iterable[int]) -> SharedTokens:
        """``ids`` in a store of their own."""
        own = ids[:] if isinstance(ids, array) and ids.typecode == "i" else array("i", ids)
        return cls(_Store(own), len(own))

    def __add__(self, tail: Iterable[int]) -> SharedTokens:
        """This sequence followed by ``tail``: written in place where this sequence ends its
        store (or the store already holds ``tail`` there), else a copy (a fork)."""
        packed = tail if isinstance(tail, array) and tail.typecode == "i" else array("i", tail)
        if self._store.write(self._len, packed):
            return SharedTokens(self._store, self._len + len(packed))
        own = self._store.ids[: self._len]
        own.extend(packed)
        return SharedTokens(_Store(own), len(own))

    def prefix(self, length: int) -> SharedTokens:
        """The first ``length`` ids, sharing this sequence's store."""
        if not 0 <= length <= self._len:
            raise ValueError(f"a prefix of {length} ids of a sequence of {self._len}")
        return SharedTokens(self._store, length)

    def view(self) -> memoryview:
        """The ids without a copy (format ``i``); valid for as long as it is held."""
        return memoryview(self._store.ids)[: self._len]

    def tolist(self) -> list[int]:
        return self.view().tolist()

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> array[int]: ...

    def __getitem__(self, index: int | slice) -> int | array[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return self._store.ids[start:stop:step]
        if not -self._len <= index < self._len:
            raise IndexError("token index out of range")
        return self._store.ids[index % self._len]

    def __iter__(self) -> Iterator[int]:
        return iter(self.view())

    def starts(self, ids: array[int]) -> bool:
        """Whether ``ids`` start with this sequence (arrays compare in C, faster than views)."""
        n = self._len
        return len(ids) >= n and ids[:n] == self._store.ids[:n]

    def __repr__(self) -> str:
        return f"SharedTokens({self.tolist()!r})"

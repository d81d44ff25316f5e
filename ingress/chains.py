"""The ingress' per-session cache of token chains: what it already sent, so it never re-renders.

A cache only: losing it (restart, another replica) costs a full render and a ``rendered`` step,
never correctness. Chains hold token ids as packed int32 (4 bytes a token) because a replica
keeps thousands of long sessions.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ingress.turn import Matcher, Message

MAX_CHAINS_PER_SESSION = 16
_TOKENS_KEY = "\0tokens"  # first item of a white-box call's match key; never a message role


@dataclass(frozen=True, eq=False)  # identity: comparing token arrays would be O(length)
class Chain:
    chain_id: str
    tools_key: str
    match_keys: tuple[tuple[Any, ...], ...]
    tokens: array[
        int
    ]  # prompt + completion of the head step, exactly as the engine saw/produced them
    head_step_id: str
    ends_with_terminator: bool
    depth: int  # steps in this chain, for the per-session step limit


class ChainStore:
    def __init__(self, max_sessions: int) -> None:
        self._sessions: OrderedDict[str, list[Chain]] = OrderedDict()
        self._max_sessions = max_sessions

    def find(
        self, session_id: str, messages: Sequence[Message], tools_key: str, matcher: Matcher
    ) -> tuple[Chain, int] | None:
        """The longest chain whose messages the request extends, and how many it covers."""
        chains = self._sessions.get(session_id)
        if not chains:
            return None
        self._sessions.move_to_end(session_id)
        keys = [m.match_key(matcher) for m in messages]
        best: tuple[Chain, int] | None = None
        for chain in chains:
            covered = len(chain.match_keys)
            if (
                chain.tools_key == tools_key
                and covered < len(keys)
                and (best is None or covered > best[1])
                and tuple(keys[:covered]) == chain.match_keys
            ):
                best = (chain, covered)
        return best

    def advance(self, session_id: str, parent: Chain | None, head: Chain) -> None:
        """Record ``head`` as the new tip; it replaces ``parent`` unless another request moved
        that chain on meanwhile, in which case both tips are kept (a fork)."""
        chains = self._sessions.setdefault(session_id, [])
        self._sessions.move_to_end(session_id)
        if parent is not None and parent in chains:
            chains.remove(parent)
        chains.append(head)
        del chains[:-MAX_CHAINS_PER_SESSION]
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)

    def find_tokens(self, session_id: str, prompt: array[int]) -> Chain | None:
        """The longest chain whose tokens the prompt starts with (a white-box call)."""
        chains = self._sessions.get(session_id)
        if not chains:
            return None
        self._sessions.move_to_end(session_id)
        best: Chain | None = None
        for chain in chains:
            n = len(chain.tokens)
            if (
                n <= len(prompt)
                and (best is None or n > len(best.tokens))
                and prompt[:n] == chain.tokens
            ):
                best = chain
        return best

    def advance_tokens(self, session_id: str, parent: Chain | None, head: Chain) -> None:
        """Record a white-box call's ``head``. Its tokens go beyond any message list, so it
        gets a match key no chat request can equal; a chat chain it extends stays cached (a
        chat call continuing those messages forks from it), a white-box one is replaced."""
        keys = (*(parent.match_keys if parent else ()), (_TOKENS_KEY, head.head_step_id))
        head = replace(head, match_keys=keys)
        white_box_parent = (
            parent is not None
            and bool(parent.match_keys)
            and parent.match_keys[-1][0] == _TOKENS_KEY
        )
        self.advance(session_id, parent if white_box_parent else None, head)

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

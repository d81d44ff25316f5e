"""The ingress' per-session cache of token chains: what it already sent, so it never re-renders.

A cache only: losing it (restart, another replica) costs a full render and a ``rendered`` step,
never correctness. Chains hold token ids as packed int32 (4 bytes a token) because a replica
keeps thousands of long sessions.

Matching a request to a chain compares its whole history (an edited history must not reuse the
tokens), so it is the one part of a TITO turn whose cost grows with the conversation. A message
the replica parsed before is the very object the chain holds (ingress/known_messages.py), so
most compare by identity; the others field for field (a C-level dict comparison), and only
those that differ pay for the matcher's keys (parsing tool arguments).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ingress.turn import Matcher, Message

MAX_CHAINS_PER_SESSION = 16


@dataclass(frozen=True, eq=False)  # identity: comparing token arrays would be O(length)
class Chain:
    chain_id: str
    tools_key: str
    messages: tuple[Message, ...]  # the conversation the tokens hold, the answer without reasoning
    tokens: array[
        int
    ]  # prompt + completion of the head step, exactly as the engine saw/produced them
    head_step_id: str
    ends_with_terminator: bool
    depth: int  # steps in this chain, for the per-session step limit
    # A white-box call's tokens go beyond any message list: no chat request matches the chain.
    white_box: bool = False
    # The control log's weight version when the chain's first step ran (None: none announced);
    # with partial rollout off a later step on other weights is refused.
    first_version: str | None = None


def _extends(messages: Sequence[Message], held: Sequence[Message], matcher: Matcher) -> bool:
    """Whether ``messages`` start with ``held`` under ``matcher``. Equal fields imply equal keys
    under every matcher, so keys are computed only for messages that differ."""
    for sent, kept in zip(messages, held, strict=False):
        if (
            sent is not kept
            and sent.__dict__ != kept.__dict__
            and sent.match_key(matcher) != kept.match_key(matcher)
        ):
            return False
    return True


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
        best: tuple[Chain, int] | None = None
        for chain in chains:
            covered = len(chain.messages)
            if (
                chain.tools_key == tools_key
                and not chain.white_box
                and covered < len(messages)
                and (best is None or covered > best[1])
                and _extends(messages, chain.messages, matcher)
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
        """Record a white-box call's ``head``, marked so no chat request matches it; a chat
        chain it extends stays cached (a chat call continuing those messages forks from it), a
        white-box one is replaced."""
        head = replace(head, messages=parent.messages if parent else (), white_box=True)
        white_box_parent = parent is not None and parent.white_box
        self.advance(session_id, parent if white_box_parent else None, head)

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

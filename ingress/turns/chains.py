"""The ingress' per-session cache of token chains: what it already sent, so it never re-renders.

A cache only: losing it (restart, another replica) costs a full render and a ``rendered`` step,
never correctness. Chains hold token ids as packed int32 (4 bytes a token, and an array's room
to grow) because a replica keeps thousands of long sessions, and a chain shares its
parent's ids (titoflow/tito/shared_tokens.py): the prompt that extends it and the head that
prompt leaves are made without copying them, so a turn's cost does not grow with the chain.

Matching a request to a chain compares its whole history (an edited history must not reuse the
tokens), so it is the one part of a TITO turn whose cost grows with the conversation. A message
the replica parsed before is the very object the chain holds (ingress/wire/known_messages.py), so
most compare by identity; the others field for field (a C-level dict comparison), and only
those that differ pay for the matcher's keys (parsing tool arguments).

Lineage follows what the client holds: a request continues the sample whose answer its history
contains. Each chain also remembers the step before its head (:class:`Prior`), so a second
sample of the head's prompt (a client retry, best-of-n) extends that step by TITO and becomes
its own tip beside the first; both stay cached and each later request follows the one it
echoes. When several samples match equally (identical answers, hence identical tokens), the
one recorded first wins: either is the exact context.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from titoflow.engine.api import EngineImage
from titoflow.tito.messages import Matcher, Message
from titoflow.tito.shared_tokens import SharedTokens

MAX_CHAINS_PER_SESSION = 16


@dataclass(frozen=True)
class Prior:
    """The step before a chain's head: its tokens are the head's first ``tokens`` ones."""

    messages: int
    tokens: int
    step_id: str
    end_token: int | None  # the step's last token if it is a stop token
    seq: int


@dataclass(frozen=True, eq=False)  # identity: comparing token arrays would be O(length)
class Chain:
    chain_id: str
    tools_digest: str  # ChatTurn.tools_digest of the calls it continues
    messages: tuple[Message, ...]  # the conversation the tokens hold, the answer without reasoning
    tokens: SharedTokens  # prompt + completion of the head step, as the engine saw/made them
    head_step_id: str
    # The head's last token if the engine stopped on it (one of the renderer's end_ids): the
    # continuation needs which one (GLM stops on the next turn's opener), not only whether.
    end_token: int | None
    depth: int  # steps in this chain, for the per-session step limit
    # A white-box call's tokens go beyond any message list: no chat request matches the chain.
    white_box: bool = False
    # The control log's weight version when the chain's first step ran (None: none announced);
    # with partial rollout off a later step on other weights is refused.
    first_version: str | None = None
    prior: Prior | None = None  # None: the head is the chain's first step
    seq: int = 0  # the order this replica recorded the head step in (set by the store)
    # The images whose expanded runs the tokens hold, each sent by uuid alone on the next call.
    images: tuple[EngineImage, ...] = ()

    def summary(self) -> Prior:
        return Prior(
            len(self.messages),
            len(self.tokens),
            self.head_step_id,
            self.end_token,
            self.seq,
        )

    def before_head(self) -> Chain | None:
        """The chain as it was before its head step (its tokens a prefix of the head's,
        shared), if known."""
        if self.prior is None:
            return None
        return replace(
            self,
            messages=self.messages[: self.prior.messages],
            tokens=self.tokens.prefix(self.prior.tokens),
            head_step_id=self.prior.step_id,
            end_token=self.prior.end_token,
            depth=self.depth - 1,
            prior=None,
            seq=self.prior.seq,
            images=tuple(i for i in self.images if i.offset < self.prior.tokens),
        )


def _same(sent: Message, kept: Message, matcher: Matcher) -> bool:
    """Equal fields imply equal keys under every matcher, so keys are computed only for
    messages that differ."""
    return (
        sent is kept
        or sent.__dict__ == kept.__dict__
        or sent.match_key(matcher) == kept.match_key(matcher)
    )


def _extends(messages: Sequence[Message], held: Sequence[Message], matcher: Matcher) -> bool:
    """Whether ``messages`` start with ``held`` under ``matcher``. All but the held answer are
    usually the very objects the chain holds (the client re-sends them, known_messages hands
    back the same objects): those compare as a tuple, in C, identity first; a Python loop over
    400 messages was the one cost of a TITO turn that grew with the conversation."""
    n = len(held)
    if n == 0:
        return True
    if tuple(messages[: n - 1]) == tuple(held[: n - 1]):  # pydantic's == means equal fields
        return _same(messages[n - 1], held[n - 1], matcher)
    return all(map(_same, messages[:n], held, [matcher] * n))


class ChainStore:
    def __init__(self, max_sessions: int) -> None:
        self._sessions: OrderedDict[str, list[Chain]] = OrderedDict()
        self._max_sessions = max_sessions
        self._recorded = 0

    def find(
        self, session_id: str, messages: Sequence[Message], tools_digest: str, matcher: Matcher
    ) -> tuple[Chain, int] | None:
        """The longest chain whose messages the request extends, and how many it covers: a
        cached tip, or the step before one (a new sample of that tip's prompt)."""
        chains = self._sessions.get(session_id)
        if not chains:
            return None
        self._sessions.move_to_end(session_id)
        best: tuple[Chain, int] | None = None
        best_rank = (-1, 0)  # (messages covered, -seq): the longest, then the earliest recorded
        before_head = False  # best is the step before its chain's head
        for chain in chains:
            if chain.tools_digest != tools_digest or chain.white_box:
                continue
            covered = len(chain.messages)
            if (
                covered < len(messages)
                and (covered, -chain.seq) > best_rank
                and _extends(messages, chain.messages, matcher)
            ):
                best, best_rank, before_head = (chain, covered), (covered, -chain.seq), False
                continue
            # Only where the head does not match: a prefix of a match matches, and is shorter.
            prior = chain.prior
            if (
                prior is not None
                and prior.messages < len(messages)
                and (prior.messages, -prior.seq) > best_rank
                and _extends(messages, chain.messages[: prior.messages], matcher)
            ):
                best, before_head = (chain, prior.messages), True
                best_rank = (prior.messages, -prior.seq)
        if best is not None and before_head:
            resampled = best[0].before_head()
            return (resampled, best[1]) if resampled is not None else None
        return best

    def advance(self, session_id: str, parent: Chain | None, head: Chain) -> None:
        """Record ``head`` as the new tip; it replaces ``parent`` unless another request moved
        that chain on meanwhile, in which case both tips are kept (a fork)."""
        self._recorded += 1
        head = replace(head, seq=self._recorded)
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
            if (best is None or len(chain.tokens) > len(best.tokens)) and chain.tokens.starts(
                prompt
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

"""The budgets and sampling overrides rollout drivers set on their sessions at open, as every
replica knows them.

Invariant: every replica judges a session's call by the same facts. The limits, the overrides
and the open time come from :class:`~schemas.events.SessionBudgeted` on ``<prefix>.ended``,
which every replica follows (and the opening replica records at once); what a call has used is
read from the call itself (the assistant turns its history holds, its prompt's length, the
clock), never from counts one replica kept, so a session moved to another replica is judged
alike. The record is bounded (the most recent budgets), like
:class:`~ingress.turns.ended_sessions.EndedSessions`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from schemas.events import SamplingOverrides, SessionBudgeted
from titoflow.errors import SessionBudgetExceeded


class SessionBudgets:
    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._budgets: OrderedDict[str, SessionBudgeted] = OrderedDict()

    def record(self, event: SessionBudgeted, _offset: int = -1) -> None:
        self._budgets[event.session_id] = event
        self._budgets.move_to_end(event.session_id)
        while len(self._budgets) > self._kept:
            self._budgets.popitem(last=False)

    def get(self, session_id: str) -> SessionBudgeted | None:
        return self._budgets.get(session_id)

    def overrides(self, session_id: str) -> SamplingOverrides | None:
        """The sampling the driver forces on the session's calls; None: none."""
        held = self._budgets.get(session_id)
        return held.sampling if held is not None and held.sampling else None

    def check(self, session_id: str, turn: Callable[[], int], now: float) -> None:
        """Refuse the session's ``turn()``-th call past its turn or wall-time budget (``turn``
        is called only for a session with a turn budget: it reads the whole history)."""
        held = self._budgets.get(session_id)
        if held is None:
            return
        budget = held.budget
        if budget.wall_s is not None and now - held.event_time > budget.wall_s:
            raise SessionBudgetExceeded(
                f"session {session_id} used up its wall-time budget of {budget.wall_s:g} s "
                f"(opened {now - held.event_time:.1f} s ago)",
                "wall_s",
                budget.wall_s,
                round(now - held.event_time, 3),
            )
        if budget.turns is not None and (number := turn()) > budget.turns:
            raise SessionBudgetExceeded(
                f"session {session_id} used up its budget of {budget.turns} turns",
                "turns",
                budget.turns,
                number - 1,
            )

    def max_tokens(self, session_id: str, wanted: int, prompt_len: int) -> int:
        """``wanted`` clamped to what the session's token budget leaves after the prompt;
        refused when the prompt alone uses it up."""
        held = self._budgets.get(session_id)
        cap = held.budget.tokens if held else None
        if cap is None:
            return wanted
        if prompt_len >= cap:
            raise SessionBudgetExceeded(
                f"session {session_id} used up its budget of {cap} tokens: the prompt has "
                f"{prompt_len}",
                "tokens",
                cap,
                prompt_len,
            )
        return min(wanted, cap - prompt_len)

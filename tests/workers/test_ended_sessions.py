"""workers/assembly/ended.py on its own: tombstones are bounded and answer for their session,
a late event stretches an ended session's span, and a commit point never falls inside one."""

from __future__ import annotations

import pytest

from workers.assembly import ended
from workers.assembly.ended import Ended, EndedSessions


def test_tombstones_keep_the_latest_ends_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ended, "MAX_TOMBSTONES", 2)
    sessions = EndedSessions()
    for offset, session_id in enumerate(["a", "b", "c"]):
        sessions.add(session_id, Ended(0, "finalized", float(offset)), (offset, offset))
    assert "a" not in sessions and "b" in sessions and sessions["c"].at == 2.0


def test_a_late_event_stretches_the_span_the_commit_point_stays_below() -> None:
    sessions = EndedSessions()
    sessions.add("s", Ended(0, "idle", 0.0), (5, 8))
    assert sessions.commit_offset(0, 7, []) == 5
    sessions.seen("s", 12)  # a step after the end: still the session's, still holds it back
    assert sessions.commit_offset(0, 11, []) == 5
    assert sessions.commit_offset(0, 13, []) == 13
    # Wholly below that commit point, the span is dropped: an open session alone decides now.
    assert sessions.commit_offset(0, 7, [6]) == 6


def test_an_open_session_straddled_by_an_ended_one_moves_the_point_to_the_first() -> None:
    sessions = EndedSessions()
    sessions.add("old", Ended(1, "finalized", 0.0), (3, 9))
    assert sessions.commit_offset(1, 20, [6]) == 3  # 6 is inside 3..9, and 3 below 6
    sessions.forget({1})
    assert "old" not in sessions and sessions.commit_offset(1, 20, []) == 20

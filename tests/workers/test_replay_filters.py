"""workers/replay/filters.py on its own: ``--session`` by record key (undecodable records too),
``--instance`` by membership from the first event naming the instance on."""

from __future__ import annotations

from schemas.events import SessionFinalized, SessionOpened
from workers.replay.filters import SessionFilter


def opened(session_id: str, instance_id: str | None) -> bytes:
    event = SessionOpened(session_id=session_id, event_time=0.0, instance_id=instance_id)
    return event.model_dump_json().encode()


def finalized(session_id: str) -> bytes:
    return SessionFinalized(session_id=session_id, event_time=0.0).model_dump_json().encode()


def test_no_filter_admits_everything() -> None:
    assert SessionFilter(None, None).admits(None, b"garbage")


def test_a_session_is_chosen_by_its_key_even_when_undecodable() -> None:
    only = SessionFilter("s1", None)
    assert only.admits(b"s1", b"garbage")
    assert not only.admits(b"s2", opened("s1", None))  # the key decides first
    assert only.admits(None, opened("s1", None))  # no key: the envelope decides
    assert not only.admits(None, b"garbage")


def test_an_instance_admits_a_session_from_the_event_naming_it_on() -> None:
    chosen = SessionFilter(None, "prompt-7")
    assert not chosen.admits(b"s1", finalized("s1"))  # not a member yet
    assert chosen.admits(b"s1", opened("s1", "prompt-7"))
    assert chosen.admits(b"s1", finalized("s1"))  # carries no instance: follows its session
    assert not chosen.admits(b"s2", opened("s2", "prompt-8"))
    assert not chosen.admits(b"s3", b"garbage")

"""``--session`` and ``--instance``: which records of the steps topic a replay applies.

Invariant: ``--session`` admits exactly that session's records (the topic is keyed by session
id; an undecodable record only by its key); ``--instance`` admits a session's records from the
first of its events that names the instance on (``session_finalized`` events carry no instance:
they follow their session). Only that envelope is read here; the assembler decodes the rest.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class _Envelope(BaseModel):
    """Just enough of a steps event to filter it."""

    model_config = ConfigDict(extra="ignore")

    session_id: str
    instance_id: str | None = None


def _peek(value: bytes | None) -> _Envelope | None:
    try:
        return _Envelope.model_validate_json(value or b"")
    except ValidationError:
        return None


class SessionFilter:
    def __init__(self, session: str | None, instance: str | None) -> None:
        self.session = session
        self.session_key = session.encode() if session is not None else None
        self.instance = instance
        self.members: set[str] = set()

    def admits(self, key: bytes | None, value: bytes | None) -> bool:
        if self.session is None and self.instance is None:
            return True
        if self.session_key is not None and key is not None:
            if key != self.session_key:  # the steps topic is keyed by session id
                return False
            if self.instance is None:
                return True
        envelope = _peek(value)
        if envelope is None:  # undecodable: only its key can attribute it
            return self.instance is None and key is not None and key == self.session_key
        if self.session is not None and envelope.session_id != self.session:
            return False
        if self.instance is None:
            return True
        if envelope.instance_id == self.instance:
            self.members.add(envelope.session_id)
        return envelope.session_id in self.members

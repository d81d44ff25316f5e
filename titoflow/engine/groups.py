"""Which key a session's engine calls are routed by: its session id, or (group routing) its
instance id, so the N sessions of one prompt (a GRPO group) rank the same engine first and share
its prefix cache instead of paying the prompt's prefill N times.

Invariant: on one replica a session's key never changes once its first call was routed by it
(sticky), so a session keeps its engine, and its prefix cache, while that engine is healthy. The
key is the instance id when one is known at the session's first call (named by that call, or by
the session's open call, which every replica learns from ``<prefix>.ended``), else the session
id, kept even when later calls name an instance. A replica that meets a session's first call
before the open call's record reached it routes by what the call names, as every call naming
its instance does everywhere. The memory is bounded (least recently used
sessions are forgotten first); forgetting a session only means its next call picks its key
again.
"""

from __future__ import annotations

from collections import OrderedDict


class RoutingKeys:
    def __init__(self, by_instance: bool, kept: int) -> None:
        self.by_instance = by_instance
        self.kept = kept
        self._keys: OrderedDict[str, str] = OrderedDict()

    def opened(self, session_id: str, instance_id: str | None) -> None:
        """The session's open call named its instance: its calls route by it from the first."""
        if self.by_instance and instance_id and session_id not in self._keys:
            self._remember(session_id, instance_id)

    def key(self, session_id: str, instance_id: str | None) -> str:
        """The routing key of a call of ``session_id`` naming ``instance_id`` (or none)."""
        if not self.by_instance:
            return session_id
        known = self._keys.get(session_id)
        if known is not None:
            self._keys.move_to_end(session_id)
            return known
        key = instance_id or session_id
        self._remember(session_id, key)
        return key

    def _remember(self, session_id: str, key: str) -> None:
        self._keys[session_id] = key
        if len(self._keys) > self.kept:
            self._keys.popitem(last=False)

"""What the control log's engine events mean for this replica's engine pool.

Each event maps to one idempotent pool operation that takes effect at once, so every replica
that applies the same log (from its beginning at start, then following) has the same pool: a
replica started after a drain starts with that engine drained, an engine added and later
removed is not there. Engines from the settings are the pool before the log is applied; the
log's later word on one of them wins.
"""

from __future__ import annotations

from schemas.control import AnyControl, EngineAdded, EngineDrained, EngineRemoved
from titoflow.engine.pool import EnginePool, EngineSpec


def apply_to_pool(pool: EnginePool, event: AnyControl) -> None:
    """Apply one control event; other commands leave the pool as it is."""
    if isinstance(event, EngineAdded):
        pool.add(EngineSpec(event.url.rstrip("/"), event.backend, event.weight))
    elif isinstance(event, EngineDrained):
        pool.drain(event.url)
    elif isinstance(event, EngineRemoved):
        pool.remove(event.url)

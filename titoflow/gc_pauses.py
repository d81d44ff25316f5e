"""The garbage collector's full collections, seen and shortened, for the long-lived services
(ingress, worker).

A full (oldest-generation) collection walks every container object the process holds, with
the event loop stopped: in an ingress, each open session's cached messages (docs/benchmarks.md
§5b measures the pause per held session-turn), so a replica holding thousands of long sessions
stops for a noticeable time whenever the collector decides to. Two things here:

- :func:`watch_full_collections` times every full collection into
  ``titoflow_gc_full_collection_seconds`` (a histogram), so the pauses are on the dashboard and
  a bench can read them. The young generations, collected many times a turn, cost the callback
  one comparison each.
- :func:`freeze_startup` moves what start-up made (modules, the tokenizer, templates, the app:
  most of a full collection's pause at a few hundred sessions, §5b) out of every
  later collection's walk (``gc.freeze``). Call it once start-up is done; objects made later are
  collected as before. What start-up made and later drops is freed by reference counting as
  before, and only its cyclic garbage would stay (start-up's cyclic garbage is collected first).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Histogram

FULL_COLLECTION_SECONDS = Histogram(
    "titoflow_gc_full_collection_seconds",
    "Python's full (oldest-generation) garbage collections, each a pause of the whole process; "
    "the walk grows with the objects held (an ingress: its cached sessions' messages).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
_OLDEST = 2
_started: list[float] = []  # when the full collection under way started (one at a time)


def _timed(phase: str, info: dict[str, Any]) -> None:
    if info["generation"] != _OLDEST:
        return
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        FULL_COLLECTION_SECONDS.observe(time.perf_counter() - _started.pop())


def watch_full_collections() -> None:
    """Time this process's full collections into :data:`FULL_COLLECTION_SECONDS` (once)."""
    if _timed not in gc.callbacks:
        gc.callbacks.append(_timed)


def freeze_startup() -> None:
    """Collect start-up's garbage, then leave every object alive now out of later walks."""
    gc.collect()
    gc.freeze()

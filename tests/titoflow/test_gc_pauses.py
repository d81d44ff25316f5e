"""The collector's full collections are timed, young ones are not, and start-up's objects leave
the walk while what is made later is collected as before."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from titoflow.gc_pauses import FULL_COLLECTION_SECONDS, freeze_startup, watch_full_collections


def _timed() -> float:
    [metric] = FULL_COLLECTION_SECONDS.collect()
    [count] = [s.value for s in metric.samples if s.name.endswith("_count")]
    return float(count)


def test_full_collections_are_timed_once_each_and_young_ones_not_at_all() -> None:
    watch_full_collections()
    watch_full_collections()  # once per process, however often called
    before = _timed()
    gc.collect(0)
    gc.collect(1)
    assert _timed() == before
    gc.collect()
    gc.collect(2)
    assert _timed() == before + 2
    assert b"titoflow_gc_full_collection_seconds_count" in generate_latest()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def frozen() -> Iterator[None]:
    try:
        yield
    finally:
        gc.unfreeze()  # the rest of the test session walks as before


def test_start_up_s_objects_leave_the_walk_and_later_cycles_are_still_collected(
    frozen: None,
) -> None:
    alive = [_Node() for _ in range(1000)]
    garbage = weakref.ref(_Node())  # start-up's own cyclic garbage: collected, not frozen
    walked = len(gc.get_objects())
    freeze_startup()
    assert garbage() is None
    assert gc.get_freeze_count() >= 1000
    assert len(gc.get_objects()) < walked - 1000
    later = weakref.ref(_Node())
    gc.collect()
    assert later() is None
    assert all(node.me is node for node in alive)

"""A test's stack on a witnessed engine (the ``*stack_settings`` fixtures of tests/conftest.py,
and the per-family stacks of tests/e2e/test_e2e_families.py): the settings with the engine behind
the witness's recording proxy, and after a test whose call passed, unless it is marked
``witness_off``, every segment on its topic held to what the engine witnessed
(tests/support/witness.py). Whether the call failed is ``CALL_FAILED`` in the test item's stash,
set by conftest's ``pytest_runtest_makereport``; unset, the check is skipped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from schemas.events import SegmentFinalized, segments_topic_adapter
from tests.support.topics import read_all
from tests.support.witness import Witness, check_segments
from titoflow.settings import Settings

T = TypeVar("T")
CALL_FAILED = pytest.StashKey[bool]()


def witnessed(
    settings: Settings,
    engine_url: str,
    model_dir: Path,
    witness: Witness,
    request: pytest.FixtureRequest,
) -> Iterator[Settings]:
    stack = settings.model_copy(
        update={
            "engine_url": witness.front(engine_url),
            "model_path": model_dir,
            "log_level": "DEBUG",
        }
    )
    yield stack
    if request.node.get_closest_marker("witness_off") or request.node.stash.get(CALL_FAILED, True):
        return
    records = _in_thread(read_all(stack, stack.topic("segments"), segments_topic_adapter))
    # Restarted workers re-publish byte-identical segments; readers drop them by id.
    unique = {s.segment_id: s for s in records if isinstance(s, SegmentFinalized)}
    check_segments(unique.values(), witness.witnessed())


def _in_thread(work: Coroutine[Any, Any, list[T]]) -> list[T]:
    """Run a coroutine to completion on its own loop (fixture teardown may be outside one)."""
    result: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.extend(asyncio.run(work))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result

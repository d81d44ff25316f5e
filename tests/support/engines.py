"""Real vLLM CPU engines for tests: one a developer already runs or one started for the test
session, and a line of engines started one ahead of the tests that take them."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from cli.dev.engine_process import start_vllm
from cli.dev.procs import ManagedProcess
from titoflow.settings import Settings

ENGINE_NICENESS = 10
# The random-weight and vision-language tiny models take 1 KiB of KV cache a token: this holds
# half a million tokens, far more than a test sends, and keeps RAM for the engines beside them.
SMALL_KV_CACHE_BYTES = 512 * 1024 * 1024


def engine_for_tests(
    running_url_variable: str, model_dir: Path, log_dir: Path, kv_cache_bytes: int | None = None
) -> Iterator[str]:
    """Yield the URL in ``running_url_variable`` if set (developers sharing one machine point
    tests at an engine already serving the same model; CI never sets it), else start vLLM on
    ``model_dir`` with ``kv_cache_bytes`` of KV cache (None: the settings' own), and stop it
    afterwards."""
    running = os.environ.get(running_url_variable)
    if running:
        yield running
        return
    settings = Settings(model_path=model_dir)
    if kv_cache_bytes is not None:
        settings = settings.model_copy(update={"engine_kv_cache_bytes": kv_cache_bytes})
    proc, url = start_vllm(settings, log_dir=log_dir)
    # The engine shares the test host's cores with the stack it serves (a GPU host runs it
    # apart): at normal priority its busy API server and engine core starved the ingress, the
    # broker and the test's own client for seconds on two cores (pauses landing 9 s late, a
    # health check timing out). Niced, it takes what they leave; its outputs do not change.
    os.setpriority(os.PRIO_PGRP, proc.pid, ENGINE_NICENESS)
    try:
        yield url
    finally:
        proc.stop()


class EngineLine:
    """Engines for a known order of takes, the next ones starting while the current one serves.

    An engine's start is mostly Python processes importing vLLM one after another (about one
    core), while a test on the engine before it mostly waits on that engine: with ``ahead``
    starts in flight, the starts overlap the tests. ``order`` lists the takes in the order the
    tests make them; a name taken by several tests is started once and stopped when its last
    taker releases it, so the takes of one name should be adjacent. A start that failed raises
    in the test that takes it; what was started and not stopped is stopped by :meth:`close`.
    """

    def __init__(
        self, order: list[str], start: Callable[[str], tuple[ManagedProcess, str]], ahead: int
    ) -> None:
        self._order = list(dict.fromkeys(order))
        self._takes = Counter(order)
        self._start = start
        self._ahead = ahead
        self._pool = ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="engine-line")
        self._started: dict[str, Future[tuple[ManagedProcess, str]]] = {}
        self._serving: dict[str, tuple[ManagedProcess, str]] = {}

    def take(self, name: str) -> str:
        """The URL of ``name``'s engine, started now unless it was started ahead or serves
        already; the next ones start."""
        self._takes[name] -= 1
        if name not in self._serving:
            started = self._started.pop(name, None) or self._pool.submit(self._start, name)
            if name in self._order:
                at = self._order.index(name) + 1
                for following in self._order[at : at + self._ahead]:
                    if following not in self._started:
                        self._started[following] = self._pool.submit(self._start, following)
            self._serving[name] = started.result()
        return self._serving[name][1]

    def release(self, name: str) -> None:
        """Stop ``name``'s engine unless a later test takes it."""
        if self._takes[name] <= 0 and name in self._serving:
            self._serving.pop(name)[0].stop()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for started in self._started.values():
            if not started.cancelled() and started.exception() is None:
                started.result()[0].stop()
        for engine, _ in self._serving.values():
            engine.stop()

"""Bounded shutdown with the broker gone: each service (worker, recompute stage, ingress,
``titoflow up``) is sent SIGTERM after its broker was killed, and exits within its
``shutdown_grace_s``. Before, aiokafka's final commit looked for the group coordinator forever: a
worker was still running 40 s after SIGTERM. Each test has its own tansu, killed without
disturbing the session's; no engine (the engine URLs point at a closed port). With the broker
up, the worker and the recompute stage commit what they consumed (the ingress and the worker
finishing work in flight: tests/cli/test_shutdown.py). Last, the watchdog that ends a process whose
shutdown is stuck regardless.

The bound asserted is the default grace (10 s) plus 3 s for the interpreter's own exit and the
test's polling: generous on a loaded 2-core machine, and far below the 40 s seen before.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.dev.broker import start_tansu
from cli.dev.model_build import RANDOM_MODEL_DIR, build_tiny_model
from cli.dev.procs import ManagedProcess, free_port
from cli.dev.stack import settings_env, start_ingress, start_recompute, start_worker
from tests.support.processes import descendants, running
from titoflow.bus import (
    Publisher,
    ensure_topics,
    existing_partitions,
    home_partition,
    make_consumer,
)
from titoflow.settings import Settings
from titoflow.shutdown import HARD_EXIT_STATUS

GRACE_S = Settings().shutdown_grace_s
BOUND_S = GRACE_S + 3.0
KEY = "a-session"
CLOSED_PORT_URL = f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[ManagedProcess, Settings]]:
    """A private tansu and settings on it (no engine behind ``engine_url``)."""
    proc, bootstrap = start_tansu(tmp_path)
    settings = Settings(
        bootstrap_servers=bootstrap,
        engine_url=CLOSED_PORT_URL,
        model_path=build_tiny_model(RANDOM_MODEL_DIR),
        log_format="text",
    )
    try:
        asyncio.run(ensure_topics(settings))
        yield proc, settings
    finally:
        proc.stop()


def sigterm_and_time(proc: ManagedProcess) -> tuple[float, int | None]:
    """SIGTERM ``proc``; seconds until it exited (BOUND_S + 1 at most) and its exit status."""
    started = time.monotonic()
    proc.signal(signal.SIGTERM)
    try:
        code: int | None = proc.proc.wait(BOUND_S + 1)
    except Exception:
        code = None
    return time.monotonic() - started, code


async def consumed(settings: Settings, topic: str, service: ManagedProcess) -> None:
    """Publish one undecodable record to ``topic`` and wait until the service dead-lettered it
    (logged once the broker acked the dead letter: killed before that, the send would still be
    waiting for its ack when the signal comes): it now has an offset to commit, the step that
    hung."""
    publisher = Publisher(settings)
    try:
        await publisher.publish(topic, KEY, b"not an event")
    finally:
        await publisher.stop()
    dead_lettered = lambda: "dead letter" in service.log_tail(20000)  # noqa: E731
    await asyncio.to_thread(service.wait_until, dead_lettered, 60, "the record dead-lettered")


@pytest.mark.parametrize("broker_dead", [True, False], ids=["broker-dead", "broker-up"])
@pytest.mark.parametrize("service", ["worker", "recompute"])
async def test_a_consumer_exits_within_the_grace(
    service: str, broker_dead: bool, broker: tuple[ManagedProcess, Settings], tmp_path: Path
) -> None:
    tansu, settings = broker
    start = start_worker if service == "worker" else start_recompute
    proc = start(settings, tmp_path)
    topic = settings.topic("steps" if service == "worker" else "recompute")
    try:
        await consumed(settings, topic, proc)
        if broker_dead:
            tansu.kill()
        elapsed, code = sigterm_and_time(proc)
        print(f"{service}, broker {'dead' if broker_dead else 'up'}: {elapsed:.2f}s, {code}")
        assert elapsed < BOUND_S, proc.log_tail()
        # Its steps were bounded: a clean exit, not the watchdog's.
        assert code == 0, proc.log_tail()
        abandoned = "the final commit did not finish within the grace" in proc.log_tail(20000)
        # The worker recommits at the end, which hung on a dead broker; the recompute stage
        # committed with its batch.
        assert abandoned == (broker_dead and service == "worker")
    finally:
        proc.kill()
    if not broker_dead:  # what it consumed is committed
        group = settings.worker_group if service == "worker" else settings.recompute_group
        partition = home_partition(KEY, list(range(8)))  # steps and recompute: 8 partitions
        assert await committed(settings, topic, group) == {partition: 1}


async def committed(settings: Settings, topic: str, group: str) -> dict[int, int]:
    consumer = make_consumer(settings, group_id=group)
    await consumer.start()
    try:
        partitions = await existing_partitions(consumer, topic)
        offsets = {tp.partition: await consumer.committed(tp) for tp in partitions}
    finally:
        await consumer.stop()
    return {partition: offset for partition, offset in offsets.items() if offset}


async def test_the_ingress_exits_within_the_grace_with_a_publish_in_flight_and_its_broker_dead(
    broker: tuple[ManagedProcess, Settings], tmp_path: Path
) -> None:
    tansu, settings = broker
    ingress, url = start_ingress(settings, tmp_path)
    try:
        tansu.kill()
        async with httpx.AsyncClient(timeout=30) as http:
            # A finalize publishes its event and answers once the broker acked it: in flight
            # (for up to publish_timeout_s) when the signal comes.
            finalize = asyncio.create_task(http.post(f"{url}/sess/s1/finalize", json={}))
            await asyncio.sleep(0.5)
            assert not finalize.done()
            elapsed, code = await asyncio.to_thread(sigterm_and_time, ingress)
            answer = await asyncio.gather(finalize, return_exceptions=True)
        assert elapsed < BOUND_S, ingress.log_tail()
        # uvicorn re-raises the signal after its shutdown: the lifespan ran to its end.
        assert code == -signal.SIGTERM, ingress.log_tail()
        assert "Application shutdown complete" in ingress.log_tail(20000)
        # The turn was never acknowledged, and the client was not told it was.
        (outcome,) = answer
        print(f"ingress, broker dead, a publish in flight: {elapsed:.2f}s, {code}, {outcome!r}")
        assert isinstance(outcome, httpx.HTTPError) or (
            isinstance(outcome, httpx.Response) and outcome.status_code >= 500
        ), outcome
    finally:
        ingress.kill()


def test_up_exits_within_the_grace_with_its_broker_dead(
    broker: tuple[ManagedProcess, Settings], tmp_path: Path
) -> None:
    tansu, settings = broker
    up = ManagedProcess(
        "up",
        [sys.executable, "-m", "cli", "up", "--run-dir", str(tmp_path / "run")],
        tmp_path / "up.log",
        {**settings_env(settings), "PYTHONUNBUFFERED": "1"},
    )
    try:
        up.wait_until(lambda: "titoflow is up" in up.log_tail(), 120, "the stack up")
        children = descendants(up.pid)
        assert len(children) >= 3  # ingress, worker, recompute (broker and engine are outside)
        tansu.kill()
        elapsed, code = sigterm_and_time(up)
        print(f"up, broker dead: {elapsed:.2f}s, {code}")
        assert elapsed < BOUND_S, up.log_tail()
        assert code == 0, up.log_tail()
        assert not [pid for pid in children if running(pid)]
    finally:
        up.stop()  # its children too, if the test failed halfway


def test_the_watchdog_ends_a_process_stuck_past_its_grace(tmp_path: Path) -> None:
    """The last resort when a step ignores its bound: a process whose shutdown is stuck (here
    a blocked main thread) exits at its grace with one line and status 1."""
    stuck = ManagedProcess(
        "stuck",
        [
            sys.executable,
            "-c",
            "import logging, time; from titoflow.shutdown import arm_hard_exit; "
            "logging.basicConfig(); arm_hard_exit(0.5, logging.getLogger('t')); time.sleep(60)",
        ],
        tmp_path / "stuck.log",
    )
    try:
        code = stuck.proc.wait(10)
    finally:
        stuck.kill()
    assert code == HARD_EXIT_STATUS
    assert "shutdown grace of 0.5s exceeded: exiting now" in stuck.log_tail()

"""The supervisor of ``titoflow up`` (cli/dev/supervisor.py) on real, short-lived child
processes: a killed child is reported (name, exit status, log file) and restarted after its
backoff; one that may not be restarted stops everything; one that keeps exiting stops everything
once past its budget. The engine's restart is tested here with a stand-in child named "engine"
(a sleeping Python: the supervisor only ever sees a process); the whole stack, with its real
children, is tests/cli/test_up_supervision.py's. The restart budget and backoff are also a property
over any sequence of exits, on fake children and a fake clock."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.dev.procs import ManagedProcess
from cli.dev.supervisor import RestartPolicy, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
FAILING = [sys.executable, "-c", "raise SystemExit(3)"]
FAST = RestartPolicy(max_restarts=2, window_s=60.0, first_backoff_s=0.1, max_backoff_s=0.4)


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Callable[[str, list[str]], ManagedProcess]]:
    """Launches children; all of them are killed afterwards."""
    children: list[ManagedProcess] = []

    def launch(name: str, argv: list[str]) -> ManagedProcess:
        child = ManagedProcess(name, argv, tmp_path / f"{name}.log")
        children.append(child)
        return child

    yield launch
    for child in children:
        if child.alive():
            child.kill()


def poll_until(supervisor: Supervisor, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert supervisor.poll() is None, supervisor.stopped
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_killed_child_is_reported_and_restarted(
    launched: Callable[[str, list[str]], ManagedProcess], tmp_path: Path
) -> None:
    lines: list[str] = []
    supervisor = Supervisor(lines.append, FAST)

    def start() -> ManagedProcess:
        return launched("engine", SLEEPER)  # a stand-in for vLLM

    first = start()
    supervisor.add("engine", first, start)
    assert supervisor.poll() is None and lines == []
    first.signal(signal.SIGKILL)
    poll_until(supervisor, lambda: supervisor.processes()["engine"] is not first)
    restarted = supervisor.processes()["engine"]
    assert restarted.alive() and restarted.pid != first.pid
    assert lines == [
        f"engine exited (killed by SIGKILL); log: {tmp_path / 'engine.log'}",
        "restarting engine in 0.1s",
        f"engine restarted (pid {restarted.pid})",
    ]


def test_a_child_that_may_not_be_restarted_stops_everything(
    launched: Callable[[str, list[str]], ManagedProcess],
) -> None:
    lines: list[str] = []
    supervisor = Supervisor(lines.append, FAST)
    broker = launched("broker", SLEEPER)
    supervisor.add("broker", broker, None, "(memory storage) died: its data is gone")
    supervisor.add("worker", launched("worker", SLEEPER), lambda: launched("worker", SLEEPER))
    broker.signal(signal.SIGKILL)
    broker.proc.wait()
    reason = supervisor.poll()
    assert reason == "broker (memory storage) died: its data is gone"
    assert lines[0].startswith("broker exited (killed by SIGKILL); log: ")
    # Stopped for good: nothing more is restarted or reported.
    supervisor.processes()["worker"].signal(signal.SIGKILL)
    time.sleep(0.2)
    assert supervisor.poll() == reason and len(lines) == 1


def test_a_child_that_keeps_exiting_stops_everything_past_its_budget(
    launched: Callable[[str, list[str]], ManagedProcess],
) -> None:
    lines: list[str] = []
    supervisor = Supervisor(lines.append, FAST)
    supervisor.add("worker", launched("worker", FAILING), lambda: launched("worker", FAILING))
    deadline = time.monotonic() + 20
    while (reason := supervisor.poll()) is None:
        assert time.monotonic() < deadline, lines
        time.sleep(0.02)
    assert reason == "worker exited 3 times within 60s; not restarting it again"
    exits = [line for line in lines if line.startswith("worker exited (exit status 3)")]
    backoffs = [line for line in lines if line.startswith("restarting worker in")]
    # Two restarts, each backoff twice the one before.
    assert len(exits) == 3
    assert backoffs == ["restarting worker in 0.1s", "restarting worker in 0.2s"]


def test_the_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(first_backoff_s=0.5, max_backoff_s=10.0)
    assert [policy.backoff_s(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]


class _Exited:
    """What the supervisor reads of a child that has exited (``Popen``'s returncode)."""

    returncode = 1


class FakeChild:
    """A child process as the supervisor sees it, dying when told: for the policy's property
    test, where thousands of exits would take real processes minutes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.log_path = Path(f"/logs/{pid}.log")
        self.proc = _Exited()
        self.dead = False

    def alive(self) -> bool:
        return not self.dead

    def release(self) -> None:
        pass


@given(
    gaps=st.lists(st.floats(0, 100), min_size=1, max_size=30),
    max_restarts=st.integers(0, 5),
)
def test_a_child_is_restarted_until_it_exits_too_often_in_the_window(
    gaps: list[float], max_restarts: int
) -> None:
    policy = RestartPolicy(max_restarts=max_restarts, window_s=60.0)
    now = [0.0]
    lines: list[str] = []
    started: list[FakeChild] = []

    def start() -> ManagedProcess:
        started.append(FakeChild(len(started)))
        return cast(ManagedProcess, started[-1])

    supervisor = Supervisor(lines.append, policy, clock=lambda: now[0])
    supervisor.add("worker", start(), start)
    exits: list[float] = []
    for gap in gaps:
        now[0] += gap
        started[-1].dead = True
        exits.append(now[0])
        recent = [t for t in exits if t >= now[0] - policy.window_s]
        reason = supervisor.poll()
        if len(recent) > max_restarts:
            assert reason == (
                f"worker exited {len(recent)} times within 60s; not restarting it again"
            )
            assert len(started) == len(exits)  # nothing restarted after the last exit
            return
        assert reason is None
        assert lines[-1] == f"restarting worker in {policy.backoff_s(len(recent)):.1f}s"
        now[0] += policy.backoff_s(len(recent))
        assert supervisor.poll() is None
        assert len(started) == len(exits) + 1 and not started[-1].dead

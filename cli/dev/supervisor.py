"""Keeps the children of ``titoflow up`` running, or stops them all with a reason.

Invariant: every exit of a supervised child is reported once, as it is noticed (its name, exit
status and log file); a restartable child is started again after a backoff that doubles with
each recent exit, unless it exited ``max_restarts`` times within ``window_s``; a child that may
not be restarted (the memory-only broker, whose data died with it), or one past its budget, makes
:meth:`Supervisor.poll` return the reason to stop, after which nothing is restarted. The class
knows processes only: what a child is, and how to start it, is its caller's.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cli.dev.procs import ManagedProcess


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    window_s: float = 60.0
    first_backoff_s: float = 0.5
    max_backoff_s: float = 10.0

    def backoff_s(self, recent_exits: int) -> float:
        return min(self.first_backoff_s * 2.0 ** max(recent_exits - 1, 0), self.max_backoff_s)


DEFAULT_POLICY = RestartPolicy()


@dataclass
class Child:
    """A supervised component: ``start`` launches it again (without waiting for it to be ready);
    ``fatal`` (non-empty: not restartable) says what its death means."""

    name: str
    proc: ManagedProcess
    start: Callable[[], ManagedProcess] | None
    fatal: str = ""
    exits: deque[float] = field(default_factory=deque)
    restart_at: float | None = None


def exit_status(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


class Supervisor:
    def __init__(
        self,
        report: Callable[[str], None],
        policy: RestartPolicy = DEFAULT_POLICY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.report = report
        self.policy = policy
        self.clock = clock
        self.children: dict[str, Child] = {}
        self.stopped: str | None = None

    def add(
        self,
        name: str,
        proc: ManagedProcess,
        start: Callable[[], ManagedProcess] | None,
        fatal: str = "",
    ) -> None:
        """Supervise ``proc``; ``start=None`` with ``fatal``: its death stops everything."""
        self.children[name] = Child(name, proc, start, fatal)

    def processes(self) -> dict[str, ManagedProcess]:
        return {name: child.proc for name, child in self.children.items()}

    def poll(self) -> str | None:
        """Notice exits, restart what is due; the reason to stop the stack, or None."""
        if self.stopped is not None:
            return self.stopped
        now = self.clock()
        for child in self.children.values():
            if child.restart_at is not None:
                if now >= child.restart_at:
                    try:
                        self._restart(child)
                    except Exception as exc:  # e.g. its port taken meanwhile
                        self.stopped = f"{child.name} could not be restarted: {exc}"
                        return self.stopped
                continue
            if child.proc.alive():
                continue
            self.stopped = self._exited(child, now)
            if self.stopped is not None:
                return self.stopped
        return None

    def _exited(self, child: Child, now: float) -> str | None:
        status = exit_status(child.proc.proc.returncode)
        self.report(f"{child.name} exited ({status}); log: {child.proc.log_path}")
        child.proc.release()
        if child.start is None:
            return f"{child.name} {child.fatal}"
        child.exits.append(now)
        while child.exits and child.exits[0] < now - self.policy.window_s:
            child.exits.popleft()
        if len(child.exits) > self.policy.max_restarts:
            return (
                f"{child.name} exited {len(child.exits)} times within "
                f"{self.policy.window_s:.0f}s; not restarting it again"
            )
        backoff = self.policy.backoff_s(len(child.exits))
        self.report(f"restarting {child.name} in {backoff:.1f}s")
        child.restart_at = now + backoff
        return None

    def _restart(self, child: Child) -> None:
        assert child.start is not None
        child.restart_at = None
        child.proc = child.start()
        self.report(f"{child.name} restarted (pid {child.proc.pid})")

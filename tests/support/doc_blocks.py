"""The code blocks of README.md and docs/ as the tests find them, and the checks that need no
stack: every Python and shell block carries a marker on the line before it saying how it is
run (or, for a shell block that needs Docker, a GPU or minutes of benchmark, that its command
lines are checked against the parsers and files they name: the flags a script takes, the
scripts and tests that exist, compose's profiles, the flags the scaffold test runs with).

Markers:
- ``<!-- runs as written: tests/project/test_doc_examples.py -->``: run as it stands, beside a
stack.
- ``<!-- runs with NAMES: tests/project/test_doc_examples.py -->``: run with NAMES (what the doc
says   is the reader's) filled in by that test.
- ``<!-- tested by tests/X.py -->`` / ``<!-- run by tests/X.py -->``: that test runs it.
- ``<!-- arguments checked: tests/project/test_doc_examples.py -->`` (shell only): not run; every
  command line is checked by :func:`argument_errors`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from titoflow.settings import PROJECT_ROOT

MARKER = re.compile(
    r"<!-- (runs as written|runs with (.+?)|tested by|run by|arguments checked):? "
    r"(tests/\S+) -->"
)
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
LANGUAGES = ("python", "bash")


@dataclass(frozen=True)
class Example:
    doc: Path
    line: int  # of the block's first line of code
    language: str
    code: str
    kind: str  # "runs as written", "runs with", "tested by", "run by", "arguments checked"; ""
    fills: tuple[str, ...]
    test: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(PROJECT_ROOT)}:{self.line}"


def examples() -> list[Example]:
    """Every Python and shell block of README.md and docs/, with its marker."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in FENCE.finditer(text):
            language = block.group(1)
            if language not in LANGUAGES:
                continue
            before = text[: block.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            line = text.count("\n", 0, block.start(2)) + 1
            marker = MARKER.fullmatch(before)
            if marker is None:
                found.append(Example(doc, line, language, block.group(2), "", (), ""))
                continue
            kind = "runs with" if marker.group(1).startswith("runs with") else marker.group(1)
            names = tuple(n.strip() for n in (marker.group(2) or "").split(",") if n.strip())
            found.append(Example(doc, line, language, block.group(2), kind, names, marker.group(3)))
    return found


def blocks_run_by(test: str, doc: str = "docs/trainer.md") -> list[str]:
    """The Python blocks of ``doc`` marked as tested or run by ``test`` (``tests/x.py``), in
    order."""
    return [
        e.code
        for e in examples()
        if e.doc == PROJECT_ROOT / doc
        and e.language == "python"
        and e.kind in ("tested by", "run by")
        and e.test == test
    ]


def run_env(path: Path) -> dict[str, str]:
    """The variables of `up`'s env file, as `set -a; . .run/env` exports them."""
    pairs = (shlex.split(line)[0].split("=", 1) for line in path.read_text().splitlines())
    return {name: value for name, value in pairs}


# ---------------------------------------------------------------- shell command lines

ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|"}
# Commands whose arguments are the reader's own (paths, URLs, revisions), nothing of ours.
FREE = {"git", "cd", "curl", "diff", "grep", "export", "set", ".", "mkdir"}
SCAFFOLDS = {"claude", "opencode", "codex"}
SCAFFOLD_TEST = PROJECT_ROOT / "tests" / "e2e" / "test_scaffolds.py"


def commands(code: str) -> list[list[str]]:
    """The command lines of a shell block: continuations joined, comments, ``$(...)``
    substitutions (one value each), redirections, subshell parentheses and leading variable
    assignments dropped, split at ``&&``, ``||``, ``;`` and ``|``."""
    code = re.sub(r"\$\([^)]*\)", "VALUE", code.replace("\\\n", " "))
    found: list[list[str]] = []
    for line in code.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        tokens = iter(lexer)
        for token in tokens:
            if token in SEPARATORS:
                found.append(current)
                current = []
            elif token in (">", "<", ">>", ">&"):
                next(tokens, None)
            elif token not in ("(", ")"):
                current.append(token)
        found.append(current)
    lines = []
    for argv in found:
        while argv and ASSIGNMENT.match(argv[0]):
            argv = argv[1:]
        if argv:
            lines.append(argv)
    return lines


class _Parsed(BaseException):
    """Raised in place of running a command once its arguments parsed."""


def parse_error(main: Callable[..., Any], argv: list[str], *call: Any) -> str | None:
    """None if ``main`` (which parses ``sys.argv``, or ``argv`` given in ``call``) accepts the
    arguments: it is stopped as soon as its parser has parsed them, before it does anything."""
    original = argparse.ArgumentParser.parse_args

    def parse(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)
        raise _Parsed

    err = io.StringIO()
    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse),
        mock.patch.object(sys, "argv", argv),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            main(*call)
        except _Parsed:
            return None
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]
    return "it ran without parsing its arguments"


def _compose_profiles() -> set[str]:
    text = (PROJECT_ROOT / "compose.yaml").read_text(encoding="utf-8")
    return {
        p.strip() for found in re.findall(r"profiles: \[(.*?)\]", text) for p in found.split(",")
    }


def argument_errors(argv: list[str]) -> list[str]:
    """What is wrong with one command line of a doc, by the parser or file it names."""
    program, *args = argv
    if program in FREE:
        return []
    if program == "titoflow":
        from cli.main import main

        error = parse_error(main, argv, args)
        return [error] if error else []
    if program.endswith("python"):
        if args[:2] == ["-m", "pytest"]:
            paths = [a.split("::")[0] for a in args[2:] if not a.startswith("-")]
            return [f"no {p}" for p in paths if not (PROJECT_ROOT / p).exists()]
        # A benchmark runs as a module (``-m bench.NAME``): bench/ imports itself as a package.
        name = args[1] if args[:1] == ["-m"] and len(args) > 1 else " ".join(args[:1])
        script = name.replace(".", "/") + ".py"
        if not re.fullmatch(r"bench\.\w+", name) or not (PROJECT_ROOT / script).is_file():
            return [f"no benchmark module {name}"]
        module = importlib.import_module(name)
        error = parse_error(module.main, [script, *args[2:]])
        return [error] if error else []
    if program == "bash":
        return [] if (PROJECT_ROOT / args[0]).is_file() else [f"no {args[0]}"]
    if program == "cp":
        return [] if (PROJECT_ROOT / args[0]).is_file() else [f"no {args[0]}"]
    if program == "docker":
        profiles = {args[i + 1] for i, a in enumerate(args) if a == "--profile"}
        unknown = profiles - _compose_profiles()
        return [f"compose.yaml has no profile {p}" for p in sorted(unknown)]
    if program in SCAFFOLDS:  # the flags tests/e2e/test_scaffolds.py runs the scaffold with
        runs = SCAFFOLD_TEST.read_text(encoding="utf-8")
        flags = [a for a in args if a.startswith("-")]
        return [
            f"{program} {f}: not what {SCAFFOLD_TEST.name} runs"
            for f in flags
            if f'"{f}"' not in runs
        ]
    return [f"a command no check knows: {program}"]

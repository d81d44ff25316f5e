"""``titoflow docs``: write, or check, the generated reference docs (titoflow/docs_gen.py).

Invariant: ``--check`` writes nothing and fails (exit status 1) naming every stale file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from titoflow.settings import PROJECT_ROOT


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    docs = sub.add_parser(
        "docs",
        help="write (or --check) event JSON Schemas, the AsyncAPI contract and the configuration "
        "reference",
    )
    docs.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs")
    docs.add_argument("--check", action="store_true")
    docs.set_defaults(func=cmd_docs)


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

"""The docs' examples marked ``<!-- runs as written: tests/test_doc_examples.py -->`` run as
written beside a real stack, with the credentials and addresses `titoflow up` hands them.

Each marked block is cut from its document as it stands and run in a fresh interpreter whose
environment is what `up`'s ``.run/env`` holds (written here by the same function `up` uses, for
this test's ingress, worker, broker and driver token), so an example that drifts from the code
fails with its document's file and line.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli.main import write_run_env
from tests.witness import Witness
from titoflow.dev.stack import start_ingress, start_worker
from titoflow.settings import PROJECT_ROOT, Settings

pytestmark = pytest.mark.engine

MARKER = "<!-- runs as written: tests/test_doc_examples.py -->"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Example:
    doc: Path
    line: int  # of the block's first line of code
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(PROJECT_ROOT)}:{self.line}"


def marked_examples() -> list[Example]:
    """Every fenced block right after the marker, in README.md and docs/."""
    found = []
    for doc in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            if before.strip() == MARKER:
                line = text.count("\n", 0, match.start(2)) + 1
                found.append(Example(doc, line, match.group(1), match.group(2)))
    return found


def run_env(path: Path) -> dict[str, str]:
    """The variables of `up`'s env file, as `set -a; . .run/env` exports them."""
    pairs = (shlex.split(line)[0].split("=", 1) for line in path.read_text().splitlines())
    return {name: value for name, value in pairs}


def test_the_rollout_loop_is_marked() -> None:
    """The example a trainer meets first stays among those run (issue 43's 401)."""
    assert any("RolloutClient" in e.code for e in marked_examples())


@pytest.mark.parametrize("example", marked_examples(), ids=lambda e: e.where)
def test_a_marked_example_runs_as_written(
    example: Example, stack_settings: Settings, witness: Witness, tmp_path: Path
) -> None:
    assert example.language == "python", f"{example.where}: only Python blocks are run"
    # As `up` runs it: driver calls need the token it made.
    settings = stack_settings.model_copy(update={"driver_token": secrets.token_urlsafe(32)})
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    try:
        env_file = write_run_env(tmp_path / "run", settings, url, settings.driver_url(url))
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TITOFLOW")}
        result = subprocess.run(
            [sys.executable, "-c", example.code],
            env={**clean, **run_env(env_file)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        ingress.stop()
        worker.stop()
    assert result.returncode == 0, (
        f"{example.where}: exited {result.returncode}:\n" + (result.stderr[-3000:])
    )
    print(f"{example.where}: {result.stdout.strip()}")

"""The Python examples of README.md and docs/ run as written beside a real stack, with the
credentials and addresses `titoflow up` hands them; every one is run here or by a test its
marker names.

Markers, on the line before a block:
- ``<!-- runs as written: tests/test_doc_examples.py -->``: a complete script, run in a fresh
  interpreter whose environment is what `up`'s ``.run/env`` holds (written here by the function
  `up` uses, for this test's ingress, worker, broker and driver token).
- ``<!-- runs with NAMES: tests/test_doc_examples.py -->``: run in this process as a notebook
  runs it (top-level ``await``), in that environment, with NAMES (what the doc says is the
  reader's: ``train_on``, ``model``, or an ``event`` it has in hand) filled from the same
  stack's segments; a consumer loop ends when ``train_on`` has had its first segment.
- ``<!-- tested by tests/X.py -->`` / ``<!-- run by tests/X.py -->``: that test runs it.

An example that drifts from the code fails with its document's file and line.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.main import write_run_env
from schemas.events import SegmentFinalized
from schemas.routed_experts import RoutedExperts
from tests.topics import read_topic
from tests.witness import Witness
from titoflow.dev.stack import start_ingress, start_worker
from titoflow.settings import PROJECT_ROOT, Settings

pytestmark = pytest.mark.engine

HERE = "tests/test_doc_examples.py"
MARKER = re.compile(
    r"<!-- (runs as written|runs with ([\w, ]+)|tested by|run by):? (tests/\S+) -->"
)
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Example:
    doc: Path
    line: int  # of the block's first line of code
    code: str
    kind: str  # "runs as written", "runs with", "tested by", "run by"; "" unmarked
    fills: tuple[str, ...]
    test: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(PROJECT_ROOT)}:{self.line}"


def python_examples() -> list[Example]:
    """Every Python block of README.md and docs/, with its marker."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in FENCE.finditer(text):
            if block.group(1) != "python":
                continue
            before = text[: block.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            line = text.count("\n", 0, block.start(2)) + 1
            marker = MARKER.fullmatch(before)
            if marker is None:
                found.append(Example(doc, line, block.group(2), "", (), ""))
                continue
            kind = "runs with" if marker.group(1).startswith("runs with") else marker.group(1)
            names = tuple(n.strip() for n in (marker.group(2) or "").split(",") if n.strip())
            found.append(Example(doc, line, block.group(2), kind, names, marker.group(3)))
    return found


def test_every_python_example_is_run() -> None:
    """Unmarked, or marked for a test that does not exist, fails with the doc's place."""
    unrun = [e.where for e in python_examples() if not e.kind]
    assert not unrun, f"Python examples no test runs (mark them): {unrun}"
    for example in python_examples():
        assert (PROJECT_ROOT / example.test).is_file(), f"{example.where}: no {example.test}"
        if example.kind in ("tested by", "run by") and example.test != HERE:
            # The named test reads this document's marked blocks.
            source = (PROJECT_ROOT / example.test).read_text()
            assert example.doc.name in source, f"{example.where}: {example.test} never reads it"
    ours = [e for e in python_examples() if e.test == HERE]
    assert any("RolloutClient" in e.code for e in ours), "the rollout loop (issue 43's 401)"


def run_env(path: Path) -> dict[str, str]:
    """The variables of `up`'s env file, as `set -a; . .run/env` exports them."""
    pairs = (shlex.split(line)[0].split("=", 1) for line in path.read_text().splitlines())
    return {name: value for name, value in pairs}


class Enough(Exception):
    """Raised by the filled ``train_on`` once it has had a segment: the loop worked."""


def fills(segment: SegmentFinalized, record: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """What a reader brings, made from a real segment of the stack (``record``: its value as
    the topic holds it, JSON)."""
    import torch

    rows = len(segment.token_ids) - 1  # every position but the last, as vLLM records them
    experts = RoutedExperts(start=0, shape=(rows, 2, 2), dtype="uint8", data=bytes(rows * 4))
    routed = segment.model_copy(update={"routed_experts": experts})
    from titoflow.client.batch import pad_segments

    batch = pad_segments([segment], pad_id=0, pad_to_multiple_of=8)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            vocabulary = int(batch["input_ids"].max()) + 1
            self.embed = torch.nn.Embedding(vocabulary, 16)
            self.head = torch.nn.Linear(16, vocabulary)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
            return type("Out", (), {"logits": self.head(self.embed(input_ids))})()

    def train_on(*args: Any) -> None:
        raise Enough(args)

    return {
        "train_on": lambda: train_on,
        "event": lambda: record,
        "segment": lambda: routed,
        "block": lambda: routed.model_dump(mode="json")["routed_experts"],
        "batch": lambda: batch,
        "advantages": lambda: np.ones(len(batch["input_ids"]), dtype=np.float32),
        "model": Model,
    }


async def run_with(example: Example, namespace: dict[str, Any]) -> None:
    code = compile(example.code, example.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    try:
        outcome = eval(code, namespace)
        if asyncio.iscoroutine(outcome):
            await asyncio.wait_for(outcome, 60)
    except Enough:
        return
    if "train_on" in example.fills:
        raise AssertionError(f"{example.where}: ended without handing train_on a segment")


async def test_the_docs_examples_run_beside_a_stack(
    stack_settings: Settings, witness: Witness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = [e for e in python_examples() if e.test == HERE]
    # As `up` runs it: driver calls need the token it made.
    settings = stack_settings.model_copy(update={"driver_token": secrets.token_urlsafe(32)})
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    failures: list[str] = []
    try:
        env = run_env(write_run_env(tmp_path / "run", settings, url, settings.driver_url(url)))
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TITOFLOW")}
        # Complete scripts first: the rollout loop fills the segments topic for the rest.
        for example in [e for e in ours if e.kind == "runs as written"]:
            result = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", example.code],
                env={**clean, **env},
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            print(f"{example.where}: {result.stdout.strip()}")
            if result.returncode != 0:
                failures.append(f"{example.where}: exited {result.returncode}\n{result.stderr}")
        records = [
            r
            for r in await read_topic(settings, settings.topic("segments"))
            if json.loads(r.value)["type"] == "segment_finalized"
        ]
        assert records, "no segment on the topic for the examples that read one"
        made = fills(
            SegmentFinalized.model_validate_json(records[0].value), json.loads(records[0].value)
        )
        for name in [n for n in os.environ if n.startswith("TITOFLOW")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        for example in [e for e in ours if e.kind == "runs with"]:
            namespace = {name: made[name]() for name in example.fills}
            try:
                await run_with(example, namespace)
            except Exception as exc:  # each example's failure, with its place
                failures.append(f"{example.where}: {type(exc).__name__}: {exc}")
    finally:
        ingress.stop()
        worker.stop()
    assert not failures, "\n".join(f[-3000:] for f in failures)

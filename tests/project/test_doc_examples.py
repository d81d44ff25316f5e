"""The examples of README.md and docs/ (Python and shell) run as written beside a real stack,
with the credentials and addresses `titoflow up` hands them; every one is run here or by a test
its marker names, or (a shell block needing Docker, a GPU or minutes of benchmark) has its
command lines checked against the parsers and files they name. The markers are those of
:mod:`tests.support.doc_blocks`; here:
- a Python block that ``runs as written`` is a complete script, run in a fresh interpreter
  whose environment is what `up`'s ``.run/env`` holds (written here by the function `up` uses,
  for this test's ingress, worker, broker and driver token); one that ``runs with NAMES`` runs
  in this process as a notebook runs it (top-level ``await``), in that environment, with NAMES
  (what the doc says is the reader's: ``train_on``, ``model``, an ``event`` it has in hand)
  filled from the same stack's segments; a consumer loop ends when ``train_on`` has had its
  first segment.
- a shell block runs in ``bash -eo pipefail`` in one directory holding `up`'s ``.run/`` (the
  env file and the driver token), in the docs' order, with that environment and ``.venv/bin``
  first on the PATH; ``runs with NAMES``: each NAME, a placeholder of the doc (a session id, an
  address, ``your-agent ...``, ``rollout.py``), is replaced with the stack's own (see
  :func:`shell_fills`). ``rollout.py`` is the Python block the doc gives right after.

An example that drifts from the code fails with its document's file and line.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.dev.stack import start_ingress, start_worker
from cli.up import write_driver_token, write_run_env
from schemas.events import SegmentFinalized
from schemas.routed_experts import RoutedExperts
from tests.support.doc_blocks import Example, argument_errors, commands, examples, run_env
from tests.support.topics import read_topic
from tests.support.witness import Witness
from titoflow.settings import PROJECT_ROOT, Settings

pytestmark = pytest.mark.engine

HERE = "tests/project/test_doc_examples.py"


def test_every_example_is_run_or_checked() -> None:
    """Unmarked, or marked for a test that does not exist, fails with the doc's place."""
    unrun = [f"{e.where} ({e.language})" for e in examples() if not e.kind]
    assert not unrun, f"examples no test runs (mark them): {unrun}"
    for example in examples():
        assert (PROJECT_ROOT / example.test).is_file(), f"{example.where}: no {example.test}"
        if example.kind in ("tested by", "run by") and example.test != HERE:
            # The named test reads this document's marked blocks.
            source = (PROJECT_ROOT / example.test).read_text()
            assert example.doc.name in source, f"{example.where}: {example.test} never reads it"
        if example.kind == "arguments checked":
            assert example.language == "bash", f"{example.where}: only a shell block is checked"
    ours = [e for e in examples() if e.test == HERE and e.language == "python"]
    assert any("RolloutClient" in e.code for e in ours), "the rollout loop (issue 43's 401)"


def test_the_command_lines_of_the_examples_not_run_parse() -> None:
    """Each command line of a block not run (its flags, the scripts, tests, profiles it names)
    is accepted by what it names: a renamed flag or a moved script fails with the doc's place."""
    checked = [e for e in examples() if e.kind == "arguments checked"]
    errors = [
        f"{e.where}: {' '.join(argv)}\n  {error}"
        for e in checked
        for argv in commands(e.code)
        for error in argument_errors(argv)
    ]
    assert not errors, "\n".join(errors)
    assert sum(len(commands(e.code)) for e in checked) > 50


def test_a_drifted_command_line_is_caught() -> None:
    """The check is not vacuous: a flag no parser has, a benchmark or script that does not
    exist, a profile compose lacks, a scaffold flag the scaffold test does not run."""
    for line in (
        "titoflow replay --no-such-flag",
        ".venv/bin/python -m bench.overhead --sessions 16 --no-such-flag",
        ".venv/bin/python -m bench.no_such_bench",
        ".venv/bin/python bench/overhead.py",  # by path, bench/ is not importable
        "bash scripts/no-such-script.sh",
        "docker compose --profile tpu up -d",
        "codex exec --no-such-flag",
        "make all",
    ):
        assert [e for argv in commands(line) for e in argument_errors(argv)], line


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


def shell_fills(settings: Settings, url: str, record: SegmentFinalized) -> dict[str, str]:
    """What each shell placeholder of the docs stands for, beside this stack: ``record`` is a
    segment of it (its session, instance and id are those the examples name)."""
    agent = (  # one call through the base URL the line sets, with the openai SDK
        f"python -c 'import openai; print(openai.OpenAI().chat.completions.create("
        f'model="{settings.served_model_name}", max_tokens=8, '
        f'messages=[{{"role": "user", "content": "Hi"}}]).choices[0].message.content)\''
    )
    return {
        "your-agent ...": agent,
        "kafka:9092": settings.bootstrap_servers,
        "sess-42": record.session_id,
        "prompt-7": record.instance_id or "",
        "http://engine:8000": settings.engine_url,
        "1e4c5c7c8e6e12d09d47a3efd7cd302f": record.segment_id,
        "INGRESS": url.removeprefix("http://"),
    }


def run_shell(example: Example, fills: dict[str, str], cwd: Path, env: dict[str, str]) -> str:
    """Runs a shell example in ``cwd``; its failure, with its place, or ""."""
    code = example.code
    for name in example.fills:
        if name == "rollout.py":  # the file the block runs: the doc's next Python block
            (cwd / name).write_text(fills[name])
        else:
            code = code.replace(name, fills[name])
    result = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", code],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    print(f"{example.where}: {result.stdout.strip()[-500:]}")
    if result.returncode != 0:
        return f"{example.where}: exited {result.returncode}\n{result.stderr}"
    return ""


def next_python(example: Example) -> Example:
    """The Python block right after ``example`` in its document."""
    return next(
        e
        for e in examples()
        if e.doc == example.doc and e.language == "python" and e.line > example.line
    )


async def test_the_docs_examples_run_beside_a_stack(
    stack_settings: Settings, witness: Witness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = [e for e in examples() if e.test == HERE and e.kind in ("runs as written", "runs with")]
    shell = [e for e in ours if e.language == "bash"]
    # As `up` runs it: driver calls need the token it made.
    settings = stack_settings.model_copy(update={"driver_token": secrets.token_urlsafe(32)})
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    failures: list[str] = []
    home = tmp_path / "home"  # where the reader runs: `up`'s .run/ beside them
    try:
        run_dir = home / ".run"
        write_driver_token(run_dir, settings.driver_token)
        env = run_env(write_run_env(run_dir, settings, url, settings.driver_url(url)))
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TITOFLOW")}
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        shell_env = {**clean, **env, "PATH": path}
        # The rollout loop first (it fills the segments topic for the rest), run as the shell
        # block before it says; then the other complete scripts.
        launchers = [e for e in shell if "rollout.py" in e.fills]
        launched = {next_python(e).where: e for e in launchers}
        for example in launchers:
            rollout = {"rollout.py": next_python(example).code}
            failures.append(await asyncio.to_thread(run_shell, example, rollout, home, shell_env))
        for example in [e for e in ours if e.kind == "runs as written" and e.language == "python"]:
            if example.where in launched:
                continue
            result = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", example.code],
                env={**clean, **env},
                cwd=home,
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
        first = SegmentFinalized.model_validate_json(records[0].value)
        made = fills(first, json.loads(records[0].value))
        for name in [n for n in os.environ if n.startswith("TITOFLOW")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        for example in [e for e in ours if e.kind == "runs with" and e.language == "python"]:
            namespace = {name: made[name]() for name in example.fills}
            try:
                await run_with(example, namespace)
            except Exception as exc:  # each example's failure, with its place
                failures.append(f"{example.where}: {type(exc).__name__}: {exc}")
        # The shell blocks, in the docs' order (a later one reads what an earlier one wrote).
        placeholders = shell_fills(settings, url, first)
        for example in [e for e in shell if e not in launchers]:
            failures.append(
                await asyncio.to_thread(run_shell, example, placeholders, home, shell_env)
            )
    finally:
        ingress.stop()
        worker.stop()
    failures = [f for f in failures if f]
    assert not failures, "\n".join(f[-3000:] for f in failures)
    ran = {e.where: e.language for e in ours}
    print(f"examples run: {len(ran)} ({sum(v == 'bash' for v in ran.values())} shell)")

"""Each benchmark runs end to end at tiny sizes and writes its results; no timing is asserted
(numbers live in docs/benchmarks.md). The overhead benchmark runs on the ZERO-LATENCY ENGINE
DOUBLE (bench/engine_double.py) and, when scripts/setup-bench.sh installed it, LiteLLM."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from bench.harness import RESULTS, ROOT

SCRIPTS = sorted(
    p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in ("__init__", "harness")
)


def plain_env() -> dict[str, str]:
    """The environment without ``PYTHONPATH``: a script runs as its docstring says, or fails."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_bench_runs_as_its_docstring_says(script: str) -> None:
    """The docstring's command line, from the repository root, reaches the script's parser."""
    doc = importlib.import_module(f"bench.{script}").__doc__ or ""
    found = re.search(r"(\.venv/bin/python -m (bench\.\w+))", doc)
    assert found and found[2] == f"bench.{script}", f"bench/{script}.py: no command line of its own"
    argv = [*shlex.split(found[1]), "--help"]
    done = subprocess.run(argv, cwd=ROOT, env=plain_env(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.startswith(b"usage:")


def run_bench(script: str, *argv: str) -> dict[str, object]:
    name = f"smoke-{script}"
    command = [sys.executable, "-m", f"bench.{script}", *argv, "--name", name]
    subprocess.run(command, cwd=ROOT, env=plain_env(), check=True, timeout=600)
    result: dict[str, object] = json.loads((RESULTS / f"{name}.json").read_text())
    assert (RESULTS / f"{name}.md").read_text().startswith(f"`.venv/bin/python -m bench.{script} ")
    return result


def test_overhead_bench_runs_every_path() -> None:
    result = run_bench("overhead", "--sessions", "2", "--turns", "3", "--concurrency", "2")
    rows = result["rows"]
    assert isinstance(rows, list)
    paths = {r["path"] for r in rows}
    proxied_paths = {"titoflow", "lean turn", "floor proxy", "pass-through"}
    assert proxied_paths | {"direct tokens", "direct chat"} <= paths
    for proxied in proxied_paths:
        row = next(r for r in rows if r["path"] == proxied)
        assert row["turns"] == 6
        assert row["engine"] == "ZERO-LATENCY DOUBLE"
        assert {"added_p50_ms", "added_early_p50_ms", "added_late_p50_ms"} <= set(row)
        assert row["proxy_cpu_ms_per_turn"] is not None
    assert "TITO work" in (RESULTS / "smoke-overhead.md").read_text()


def test_lean_turn_renders_what_a_whole_render_does() -> None:
    """The lean turn is a measure of titoflow's TITO work only if it does that work: each
    turn's prompt, continued from the last, is the whole conversation's render."""
    from bench.lean_turn import LeanTurns, message_of
    from bench.overhead import TOOLS, first_messages, tool_output
    from titoflow.settings import Settings
    from titoflow.tito.messages import ToolCall
    from titoflow.tito.output import ParsedOutput
    from titoflow.tito.render import ChatRenderer
    from titoflow.tito.tokenizer import load_tokenizer

    renderer = ChatRenderer.for_setting(load_tokenizer(Settings().model_path), "auto")
    turns, tools = LeanTurns(renderer), list(TOOLS)
    raw = first_messages(3)
    for turn in range(4):
        session, tail = turns.prompt("s", list(raw), tools)
        whole = renderer.full_prompt([message_of(m) for m in raw], tools, {})
        assert list(session.tokens) == whole
        assert tail == whole[len(whole) - len(tail) :]
        call = ToolCall(id=f"call_{turn}", name="read_file", arguments='{"path": "a.py"}')
        text = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
        completion = [*renderer.encode(text), renderer.terminator_id]
        echo = LeanTurns.answered(session, ParsedOutput("", tool_calls=[call]), completion)
        raw = [
            *raw,
            echo,
            {"role": "tool", "tool_call_id": call.id, "content": tool_output(3, turn, 80)},
        ]
    assert turns.sessions["s"].raw[: len(raw) - 1] == raw[:-1]


def test_tito_cost_bench_measures_each_turn() -> None:
    result = run_bench("tito_cost", "--turns", "1", "3", "--repeat", "2")
    rows = result["rows"]
    assert isinstance(rows, list)
    assert [r["turn"] for r in rows] == [1, 3]
    assert rows[0]["tito_ms"] is None  # turn 1 has no chain to extend
    assert rows[1]["prompt_tokens"] > rows[0]["prompt_tokens"]


def test_publish_bench_measures_both_publishers() -> None:
    result = run_bench(
        "publish", "--bytes", "100", "--records", "3", "--calls", "2", "--rounds", "2"
    )
    rows = result["rows"]
    assert isinstance(rows, list)
    assert [r["publisher"] for r in rows] == ["aiokafka", "faststream"]
    assert all(len(r["rounds_cpu_us_per_record"]) == 2 for r in rows)


@pytest.mark.parametrize("script", ["pipeline", "memory"])
def test_pipeline_and_memory_benches_run(script: str) -> None:
    if script == "pipeline":
        argv = ["--workers", "1", "--tokens", "100", "--steps", "16", "--steps-per-session", "2"]
    else:
        argv = ["--sessions", "20", "--turns", "1", "--steps", "1", "--tokens", "50"]
    result = run_bench(script, *argv)
    rows = result["rows"]
    assert isinstance(rows, list) and rows
    if script == "pipeline":
        assert rows[0]["steps"] == 16
        assert rows[0]["step_bytes_per_token_packed"] < rows[0]["step_bytes_per_token_json_lists"]
    else:
        assert {r["process"] for r in rows} == {"ingress", "worker"}


def test_assembly_bench_measures_a_step_here_and_against_a_checkout() -> None:
    argv = ["--tokens", "50", "--sessions", "2", "--rounds", "1", "--against", str(ROOT)]
    rows = run_bench("assembly", *argv)["rows"]
    assert isinstance(rows, list)
    [row] = rows
    assert row["us_per_step"] > 0 and row["against_us_per_step"] > 0 and row["ratio"] > 0


def test_capacity_bench_prints_the_model_and_checks_it_at_a_load() -> None:
    argv = ["--burst", "4", "--unit-sessions", "4", "--sessions", "8", "--turns", "2"]
    result = run_bench("capacity", *argv, "--period", "1")
    unit, checked, models = result["unit"], result["check"], result["model"]
    assert isinstance(unit, dict) and isinstance(checked, list) and isinstance(models, list)
    assert unit["tokens_per_turn"] > 0 and unit["steps_bytes_per_token"] > 0
    assert unit["segments_per_session"] == 1.0  # every burst session was finalized into one
    figures = {row["figure"]: row for row in checked}
    assert set(figures) == {
        "turns/s held", "ingress CPU s", "worker CPU s", "ingress RSS MB", "worker RSS MB",
        "steps topic MB",
    }  # fmt: skip
    assert figures["steps topic MB"]["measured"] > 0  # the check's 16 steps were read back
    assert [m["sessions"] for m in models] == [1000, 10000, 100000]
    assert all(m["partitions"] >= 2 * m["workers"] for m in models)


def test_edge_cost_bench_times_each_capture_here_and_against_a_checkout() -> None:
    argv = ["--repeat", "2", "--rounds", "1", "--against", str(ROOT)]
    rows = run_bench("edge_cost", *argv)["rows"]
    assert isinstance(rows, list) and len(rows) == 10  # nine captures and the long history
    for row in rows:
        assert row["us"] > 0 and row["against_us"] > 0 and row["ratio"] > 0


def test_export_bench_times_every_path() -> None:
    argv = ["--segments", "6", "--tokens", "40", "--rounds", "1"]
    rows = run_bench("export", *argv)["rows"]
    assert isinstance(rows, list)
    assert [r["path"] for r in rows] == [
        "jsonl -> parquet",
        "topic -> parquet",
        "parquet -> datasets",
        "read_segments(parquet)",
        "read_segments(datasets)",
    ]
    assert all(r["segments"] == 6 and r["segments_per_s"] > 0 for r in rows)


def test_retention_bench_measures_bytes_per_token() -> None:
    result = run_bench("retention", "--tokens", "100", "400", "--sessions", "1")
    # Packed arrays: 4/3 of int32 ids + float32 logprobs + two uint8 masks per segment token.
    assert result["segment_bytes_per_token"] == pytest.approx(40 / 3, abs=0.05)
    assert isinstance(result["captures"], list) and result["captures"]
    assert float(str(result["text_bytes_per_token"])) > 1

"""What the benchmarks share: the processes they run, what they read of them, results, and the
captured Claude Code tool list (the TITO-cost benchmark's and the template tests' long one).

Processes are the real ones (tansu, the ingress and workers as ``titoflow`` starts them, LiteLLM's
proxy from ``.venv-bench``), plus the zero-latency engine double of ``bench/engine_double.py``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from cli.dev.procs import ManagedProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BENCH_VENV = ROOT / ".venv-bench"
_TICKS = os.sysconf("SC_CLK_TCK")
CLAUDE_CODE = ROOT / "bench/captures/claude-default/001-sess-x-v-messages.json"


def claude_code_tools() -> tuple[dict[str, Any], ...]:
    """Claude Code's default tool list as its captured request sent it, as OpenAI tools."""
    tools = json.loads(CLAUDE_CODE.read_text())["body"]["tools"]
    return tuple(
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t["input_schema"],
            },
        }
        for t in tools
    )


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else 0.0,
    }


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU time so far of every live process in group ``pgid`` (a managed child
    and whatever it spawned)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        # After the command: pgrp is field 5 (1-based), utime 14, stime 15.
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def write_results(name: str, command: str, data: dict[str, Any], table: str) -> Path:
    """Print ``table``; write ``bench/results/<name>.json`` and ``.md``: the numbers, the
    command and the machine."""
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"command": command, "machine": machine(), **data}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2))
    (RESULTS / f"{name}.md").write_text(
        f"`{command}`\n\nmachine: {payload['machine']}\n\n```\n{table}\n```\n"
    )
    return RESULTS / f"{name}.json"


def command_line() -> str:
    """The command as run: ``.venv/bin/python -m bench.<name> ARGS`` (``sys.argv[0]`` is the
    module's file)."""
    return " ".join([".venv/bin/python", "-m", f"bench.{Path(sys.argv[0]).stem}", *sys.argv[1:]])


@contextmanager
def started_processes(prefix: str) -> Iterator[tuple[Path, list[ManagedProcess]]]:
    """A log directory for the processes a benchmark starts and the list it adds them to: they
    are stopped, the last started first, and the directory removed, however the run ends."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        started: list[ManagedProcess] = []
        try:
            yield Path(tmp), started
        finally:
            for proc in reversed(started):
                proc.stop()


def wait_http(proc: ManagedProcess, url: str, timeout_s: float = 120) -> None:
    def ready() -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code < 500
        except httpx.HTTPError:
            return False

    proc.wait_until(ready, timeout_s, f"an answer on {url}")


def start_double(log_dir: Path, model_path: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = ManagedProcess(
        "engine-double",
        [
            sys.executable,
            str(ROOT / "bench" / "engine_double.py"),
            "--port",
            str(port),
            "--model-path",
            str(model_path),
        ],
        log_dir / "engine-double.log",
        {"PYTHONPATH": str(ROOT)},
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(proc, f"{url}/health")
    return proc, url


def start_floor_proxy(
    log_dir: Path, engine_url: str, bootstrap: str, topic: str | None
) -> tuple[ManagedProcess, str]:
    """``bench/floor_proxy.py`` in front of ``engine_url``'s chat completions, publishing each
    answer to ``topic`` (None: a plain pass-through)."""
    name = "floor-proxy" if topic else "pass-through"
    return _start_on_stack(name, "floor_proxy.py", log_dir, engine_url, bootstrap, topic)


def start_lean_turn(
    log_dir: Path, engine_url: str, bootstrap: str, topic: str
) -> tuple[ManagedProcess, str]:
    """``bench/lean_turn.py`` in front of ``engine_url``'s token API, publishing to ``topic``."""
    return _start_on_stack("lean-turn", "lean_turn.py", log_dir, engine_url, bootstrap, topic)


def _start_on_stack(
    name: str, script: str, log_dir: Path, engine_url: str, bootstrap: str, topic: str | None
) -> tuple[ManagedProcess, str]:
    """A bench process on the floor proxy's stack (``stack_arguments``), once it answers."""
    port = free_port()
    proc = ManagedProcess(
        name,
        [
            sys.executable,
            str(ROOT / "bench" / script),
            *("--port", str(port), "--engine-url", engine_url, "--bootstrap", bootstrap),
            *(("--topic", topic) if topic else ()),
        ],
        log_dir / f"{name}.log",
        {"PYTHONPATH": str(ROOT)},
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(proc, f"{url}/health")
    return proc, url


LITELLM_KEY = "sk-titoflow-bench-0123456789abcdef0123456789abcdef"


def litellm_available() -> bool:
    return (BENCH_VENV / "bin" / "litellm").exists()


def start_litellm(log_dir: Path, chat_base_url: str, model: str) -> tuple[ManagedProcess, str]:
    """LiteLLM's proxy (one process, no database) forwarding ``policy`` to ``chat_base_url``'s
    OpenAI chat completions."""
    if not litellm_available():
        raise RuntimeError("LiteLLM is not installed: run `bash scripts/setup-bench.sh`")
    config = log_dir / "litellm.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            model_list:
              - model_name: policy
                litellm_params:
                  model: openai/{model}
                  api_base: {chat_base_url}/v1
                  api_key: unused
            litellm_settings:
              telemetry: false
              drop_params: true
            general_settings:
              master_key: {LITELLM_KEY}
            """
        )
    )
    port = free_port()
    proc = ManagedProcess(
        "litellm",
        [str(BENCH_VENV / "bin" / "litellm"), "--config", str(config), "--port", str(port)],
        log_dir / "litellm.log",
        {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of the price list at start
            "LITELLM_LOG": "ERROR",
            "DISABLE_SCHEMA_UPDATE": "True",
        },
        cwd=log_dir,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(proc, f"{url}/health/liveliness", timeout_s=180)
    return proc, url

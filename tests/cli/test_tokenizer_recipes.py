"""A tokenizer recipe's hash covers the code it runs from the package's other modules, so a
change to shared code rebuilds every directory written with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.dev import tokenizers
from cli.dev.tokenizers import stand_in


def test_a_change_to_shared_code_changes_the_recipes_that_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs_it, does_not = tokenizers.source("nemotron3"), tokenizers.source("llama3")
    before = {module: tokenizers._recipe(module) for module in (runs_it, does_not)}
    changed = tmp_path / "stand_in.py"
    changed.write_bytes(Path(stand_in.__file__).read_bytes() + b"# changed\n")
    monkeypatch.setattr(stand_in, "__file__", str(changed))
    assert tokenizers._recipe(runs_it) != before[runs_it]
    assert tokenizers._recipe(does_not) == before[does_not]

"""The code blocks of README.md and docs/ that a test runs, as the test finds them: by the
``<!-- tested by tests/X.py -->`` marker on the line before the block."""

from __future__ import annotations

import re

from titoflow.settings import PROJECT_ROOT


def blocks_run_by(test: str, doc: str = "docs/trainer.md") -> list[str]:
    """The Python blocks of ``doc`` marked as tested by ``test`` (``tests/x.py``), in order."""
    text = (PROJECT_ROOT / doc).read_text(encoding="utf-8")
    marker = re.escape(f"<!-- tested by {test} -->")
    return [str(b) for b in re.findall(marker + r"\s*```python\n(.*?)```", text, re.DOTALL)]

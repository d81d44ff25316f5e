"""Generated reference docs (event JSON Schemas, configuration table) match the code."""

from __future__ import annotations

from titoflow.docs_gen import stale_docs
from titoflow.settings import PROJECT_ROOT


def test_generated_docs_are_current() -> None:
    assert stale_docs(PROJECT_ROOT / "docs") == [], "run `titoflow docs`"

"""Generated reference docs (event JSON Schemas, configuration table) match the code, and the
layout docs/architecture.md describes is the tree's."""

from __future__ import annotations

import re
from pathlib import Path

from titoflow.docs_gen import stale_docs
from titoflow.settings import PROJECT_ROOT


def test_generated_docs_are_current() -> None:
    assert stale_docs(PROJECT_ROOT / "docs") == [], "run `titoflow docs`"


ARCHITECTURE = PROJECT_ROOT / "docs" / "architecture.md"
CODE = ("schemas", "titoflow", "ingress", "workers", "cli")
NAMED = re.compile(r"`([\w./-]+?(?:\.py|/))`")


def layout_errors(doc: str, root: Path = PROJECT_ROOT) -> list[str]:
    """What the layout table of docs/architecture.md (``| `pkg/` | ... |``, one row a package)
    gets wrong about the tree under ``root``: a path named that does not exist (a name resolves
    against its row's package, then its parents, then the root), or, in a row of our code's
    packages, a module or folder of that package it does not name."""
    section = doc.split("## Packages and their layers", 1)[1].split("\n## ", 1)[0]
    rows = {
        row[0]: row[1:]
        for line in section.splitlines()
        if line.startswith("| `") and (row := NAMED.findall(line))
    }
    errors = [f"no row for {top}/" for top in CODE if f"{top}/" not in rows]
    for package, names in rows.items():
        if not (root / package).is_dir():
            errors.append(f"row {package}: no such folder")
            continue
        bases = [Path(package), *Path(package).parents]
        found = set()
        for name in names:
            path = next((b / name for b in bases if (root / b / name).exists()), None)
            if path is None:
                errors.append(f"row {package}: no {name}")
            else:
                found.add(path)
        if package.split("/")[0] not in CODE:
            continue
        for child in sorted((root / package).iterdir()):
            relative = child.relative_to(root)
            if child.name.startswith(("_", ".")) or relative in found:
                continue
            if child.suffix == ".py" or (child.is_dir() and f"{relative}/" not in rows):
                errors.append(f"row {package}: {child.name} is not named")
    return errors


def test_the_architecture_layout_matches_the_tree() -> None:
    assert layout_errors(ARCHITECTURE.read_text(encoding="utf-8")) == []


def test_a_drifted_layout_is_caught(tmp_path: Path) -> None:
    """The check is not vacuous: a moved module, a module left out, a package without a row."""
    for top in CODE:
        (tmp_path / top).mkdir()
    (tmp_path / "titoflow" / "bus").mkdir()
    (tmp_path / "titoflow" / "bus" / "topics.py").touch()
    (tmp_path / "titoflow" / "settings.py").touch()
    rows = "".join(f"| `{top}/` | |\n" for top in CODE if top != "titoflow")
    doc = (
        "## Packages and their layers\n"
        "| `titoflow/` | `settings.py`, `bus.py` |\n"
        f"{rows}| `titoflow/bus/` | `producer.py` |\n## Next\n"
    )
    assert layout_errors(doc, tmp_path) == [
        "row titoflow/: no bus.py",
        "row titoflow/bus/: no producer.py",
        "row titoflow/bus/: topics.py is not named",
    ]
    assert "no row for titoflow/" in layout_errors(doc.replace("`titoflow/` |", "x |"), tmp_path)

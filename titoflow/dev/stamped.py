"""Directories the project builds from a recipe (tokenizers, tiny models): built whole beside
their place and renamed into it, and stamped with the recipe's hash.

Invariant: a directory is only ever written or replaced when it holds the project's stamp (or
does not exist yet), so a path naming someone's own files is refused, never overwritten; a
stamp is the last thing written, so a stamped directory is complete.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build_stamped(
    dest: Path, stamp: str, recipe: str, write: Callable[[Path], None], **noted: Any
) -> Path:
    """``dest``, built by ``write`` into a fresh directory unless its ``stamp`` file already
    records ``recipe``; ``noted`` goes into the stamp beside the recipe."""
    stamp_file = dest / stamp
    if stamp_file.is_file() and json.loads(stamp_file.read_text()).get("recipe") == recipe:
        return dest
    if dest.exists() and not stamp_file.is_file():
        raise RuntimeError(f"{dest} exists but was not made by titoflow; move it away")
    tmp = dest.with_name(f".{dest.name}.building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    (tmp / stamp).write_text(json.dumps({"recipe": recipe, **noted}) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest

"""Directories the project builds from a recipe (tokenizers, tiny models): built whole beside
their place and renamed into it, and stamped with the recipe's hash.

Invariant: a directory is only ever written or replaced when it holds the project's stamp, is
empty or does not exist yet, so a path naming someone's own files is refused (:class:`NotOurs`)
before anything is written; a stamp is the last thing written, so a stamped directory is
complete. A path names the same directory relative or absolute. Builders of one directory take
turns (a lock file beside it), so two processes asking at once get one build, never a directory
replaced under the other's feet.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


class NotOurs(RuntimeError):
    """``dest`` holds files and no stamp of the project's: nothing was written to it."""

    def __init__(self, dest: Path) -> None:
        super().__init__(f"{dest} exists but was not made by titoflow; move it away")
        self.dest = dest


def read_stamp(dest: Path, stamp: str) -> dict[str, Any]:
    """What ``dest``'s stamp records ({} without one; a damaged one records nothing, so the
    directory is rebuilt)."""
    try:
        recorded = json.loads((dest / stamp).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def build_stamped(
    dest: Path, stamp: str, recipe: str, write: Callable[[Path], None], **noted: Any
) -> Path:
    """``dest`` (made absolute), built by ``write`` into a fresh directory unless its ``stamp``
    file already records ``recipe``; ``noted`` goes into the stamp beside the recipe."""
    dest = Path(os.path.abspath(dest))  # `.` and `../x` have a name to build beside
    if _current(dest, stamp, recipe):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(f".{dest.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _current(dest, stamp, recipe):  # built by another process meanwhile
            return dest
        tmp = dest.with_name(f".{dest.name}.building")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        (tmp / stamp).write_text(json.dumps({"recipe": recipe, **noted}) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest


def _current(dest: Path, stamp: str, recipe: str) -> bool:
    """Whether ``dest`` holds the build of ``recipe``; :class:`NotOurs` if it holds others'."""
    if (dest / stamp).is_file():
        return read_stamp(dest, stamp).get("recipe") == recipe
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise NotOurs(dest)
    return False

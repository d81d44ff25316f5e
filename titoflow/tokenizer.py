"""Loads the policy's tokenizer and chat template from a local model directory, never a hub."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Checked at import time by transformers/huggingface_hub: no process of ours downloads a model.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # silences "PyTorch was not found"

from transformers import AutoTokenizer


def load_tokenizer(model_path: Path) -> Any:
    if not (model_path / "tokenizer_config.json").exists():
        raise FileNotFoundError(
            f"no tokenizer at {model_path}: build the local model with `titoflow build-model` "
            "or point TITOFLOW_MODEL_PATH at an HF model directory"
        )
    return AutoTokenizer.from_pretrained(model_path, local_files_only=True)

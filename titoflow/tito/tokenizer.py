"""Loads the policy's tokenizer and chat template from a local model directory, never a hub."""

from __future__ import annotations

import os
from collections.abc import Callable
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


def text_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """``tokenizer.encode(text, add_special_tokens=False)``, called on the Rust backend directly
    when that gives the same ids: no truncation or padding configured on it (transformers turns
    them off per call) and special tokens split as transformers splits them. transformers'
    wrapper around the backend cost 70 of 170 µs for a tool result's 99 tokens on a busy
    machine (cold caches), as much as a third of the TITO continuation."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is None
        or backend.truncation is not None
        or backend.padding is not None
        or backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False))
    encode = backend.encode
    return lambda text: encode(text, add_special_tokens=False).ids  # a new list per call

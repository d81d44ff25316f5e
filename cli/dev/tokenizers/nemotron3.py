"""NVIDIA Nemotron 3 (NVIDIA-Nemotron-3-Nano-30B-A3B): a labelled stand-in vocabulary with the
model's chat template as a public repository vendors it.

The chat template is Nemotron 3 Nano's as llama.cpp vendors it,
``models/templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja``, read in the zommiommy/llama.cpp
mirror at commit a2c9fce98399d2ad9a22f892927307e4ca93a4a4 and kept verbatim, CRLF line ends
included, in ``templates/nemotron3.jinja`` (10,708 bytes, SHA-256 650b9d30…5e02ce, the digest
the Raudbjorn/ggml-llama.cpp mirror's Git LFS pointer @0ae4fc2 names for the same path).
NVIDIA's GitHub repositories hold no copy we could read.

Nemotron 3's own ``tokenizer.json`` is in no PyPI package and no public repository we can read,
so the tokenizer is the tekken vocabulary of the ``mistral`` family (mistral-common's
131,072-id BPE, the base Nemotron Nano v2's stand-in uses too) with ChatML's turn markers added
as special tokens (``<|im_end|>`` the end-of-sequence token) and the reasoning, call and result
markers as added tokens (one token each, kept when special tokens are skipped: the parser reads
them).

Invariant: every marker the template writes or the model generates is one token, and the
written files are a function of the mistral recipe's output, the template and this module alone.
"""

from __future__ import annotations

from pathlib import Path

from cli.dev.tokenizers import tokenizer_dir
from cli.dev.tokenizers.stand_in import write_stand_in

PACKAGES = ("mistral-common", "transformers", "tokenizers")
STAND_IN = (
    "Mistral's tekken vocabulary + Nemotron 3's markers (its tokenizer.json is in no package or "
    "public repo): markers are single tokens, but ids and text token boundaries are tekken's, "
    "so token-level proofs hold for this stand-in, not Nemotron 3's vocabulary"
)
TEMPLATE = "nemotron3.jinja"
START, END = "<|im_start|>", "<|im_end|>"
# What the template writes and the model generates besides the turn markers.
MARKERS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

BASE = "mistral"


def write(dest: Path) -> None:
    specials = {"eos_token": END, "additional_special_tokens": [START]}
    write_stand_in(dest, tokenizer_dir(BASE), TEMPLATE, specials, MARKERS)

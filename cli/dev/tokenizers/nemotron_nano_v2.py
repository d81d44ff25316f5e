"""NVIDIA Nemotron Nano v2 (NVIDIA-Nemotron-Nano-9B-v2/12B-v2): a labelled stand-in vocabulary
with the model's chat template as a public repository vendors it.

The chat template is NVIDIA-Nemotron-Nano-v2's as ggml-org/llama.cpp vendors it,
``models/templates/NVIDIA-Nemotron-Nano-v2.jinja``, commit
f01caef75bdbeb16a11e1aa168e7c419589df8f6 (5,505 characters), kept verbatim in
``templates/nemotron_nano_v2.jinja``. llama.cpp names no edits to it; NVIDIA's GitHub
repositories hold no copy we could read, so it is compared with no other.

Nemotron Nano v2's own ``tokenizer.json`` is in no PyPI package and no public repository we can
read, so the tokenizer is the tekken vocabulary of the ``mistral`` family (mistral-common's
131,072-id BPE) with Nemotron's turn markers added as special tokens (``<SPECIAL_10>`` opening
the system block, ``<SPECIAL_11>`` a user or assistant turn, ``<SPECIAL_12>`` ending a turn,
the end-of-sequence token) and its reasoning and tool markers as added tokens (one token each,
kept when special tokens are skipped: the parser reads them).

Invariant: every marker the template writes or the model generates is one token, as the
template's layout assumes, and the written files are a function of the mistral recipe's output,
the template and this module alone.
"""

from __future__ import annotations

from pathlib import Path

from cli.dev.tokenizers import tokenizer_dir
from cli.dev.tokenizers.stand_in import write_stand_in

PACKAGES = ("mistral-common", "transformers", "tokenizers")
STAND_IN = (
    "Mistral's tekken vocabulary + Nemotron Nano v2's markers (its tokenizer.json is in no "
    "package or public repo): markers are single tokens, but ids and text token boundaries are "
    "tekken's, so token-level proofs hold for this stand-in, not Nemotron's vocabulary"
)
TEMPLATE = "nemotron_nano_v2.jinja"
SYSTEM, TURN, EOS = "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>"
# What the template writes and the model generates besides the turn markers.
MARKERS = (
    "<think>",
    "</think>",
    "<TOOLCALL>",
    "</TOOLCALL>",
    "<AVAILABLE_TOOLS>",
    "</AVAILABLE_TOOLS>",
    "<TOOL_RESPONSE>",
    "</TOOL_RESPONSE>",
)

BASE = "mistral"


def write(dest: Path) -> None:
    specials = {"eos_token": EOS, "additional_special_tokens": [SYSTEM, TURN]}
    write_stand_in(dest, tokenizer_dir(BASE), TEMPLATE, specials, MARKERS)

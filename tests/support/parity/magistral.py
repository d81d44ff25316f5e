"""Magistral Small 2506's cases for the parser parity test. vLLM's parser is given vLLM's own
``MistralTokenizer`` over the v11 ``tekken.json`` (``tokenizer_mode=mistral``, as Magistral's
model card serves it): only there does vLLM 0.32's ``mistral`` reasoning parser read v11's
``<think>``/``</think>`` text (it reads them for a tokenizer that supports Mistral's grammar,
which a Hugging Face tokenizer does not: in ``hf`` mode it reads no reasoning at all).

Found on the way and declared: in that mode the content reaches vLLM's tool parser without the
``[CALL_ID]`` control token, so a call as mistral-common's v11 encoder writes it
(``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}``) comes out of vLLM named ``NAMEID``.
"""

from __future__ import annotations

import random
import re

from cli.dev.tokenizers.mistral_v11 import tekken_v11
from tests.support.parity import (
    READ_ARGUMENTS,
    Call,
    Case,
    Difference,
    Family,
    cut_after,
    drop_one,
    mutants,
)
from tests.support.parity.mistral import MISTRAL_TOOLS
from tests.support.parity.mistral_v11 import (
    V11_DIFFERENCES,
    V11_MALFORMED,
    V11_VLLM,
    v11_bases,
    v11_mutate,
)

THOUGHT = "<think>The user wants src/a.py.\nRead it first.</think>"
CALL = "[TOOL_CALLS]read_file[CALL_ID]a1B2c3D4e[ARGS]" + READ_ARGUMENTS
# Without the id (v13's and Devstral's shape): vLLM names it as written (see the module's note).
CALL_NO_ID = "[TOOL_CALLS]read_file[ARGS]" + READ_ARGUMENTS


# vLLM tests/reasoning/test_mistral_reasoning_parser.py, commit
# 04dbd8f32c4dc8ef1254eeaabd154a225948cf57, its outputs verbatim but for v13's [THINK]/[/THINK]
# tokens written as v11's <think>/</think> text (the markers Magistral Small 2506 writes).
MAGISTRAL_VLLM = [
    Case("vllm_simple_reasoning", "This is a reasoning section</think>This is the rest"),
    Case("vllm_no_content", "This is content"),
    Case("vllm_multiple_lines", "This\nThat</think>This is the rest\nThat"),
    Case("vllm_shortest", "</think>This is the rest"),
    Case("vllm_reasoning_with_think", "<think>This is a reasoning section</think>This is the rest"),
    Case("vllm_complete_reasoning_with_think", "<think>This is a reasoning section</think>"),
    Case("vllm_multiple_lines_with_think", "<think>This\nThat</think>This is the rest\nThat"),
    Case("vllm_think_no_end", "<think>This is a reasoning section"),
    Case("vllm_empty", ""),
    Case("vllm_new_line", "\n<think>This is a reasoning section</think>\nThis is the rest"),
]

# What Magistral writes: v11's outputs after its reasoning, and a call it opens inside it.
MAGISTRAL_WRITES = [
    *(Case(f"reasoned_{case.name}", THOUGHT + case.text) for case in V11_VLLM + V11_MALFORMED),
    Case("call_inside_reasoning", "<think>I should read it." + CALL),
    Case("call_inside_reasoning_then_its_closer", "<think>Read it." + CALL + "</think>Done."),
    Case("reasoning_cut_off", "<think>I should read src/a.py, then [TOOL_CA"),
    Case("think_markers_in_content", "Sure: <think>x</think>" + CALL),
]


def magistral_bases() -> list[tuple[str, bool]]:
    return [(THOUGHT + text, False) for text, _ in v11_bases()] + [
        ("<think>Maybe" + CALL_NO_ID, False),
        ("<think>Maybe" + CALL_NO_ID + "</think>Done.", False),
    ]


def magistral_mutate(text: str, rng: random.Random) -> str:
    op = rng.choice(["v11", "v11", "cut", "drop"])
    if op == "cut":  # cut anywhere, the reasoning too
        return cut_after(text, "<think>", rng)
    if op == "drop":
        return drop_one(text, rng.choice(["<think>", "</think>"]), rng)
    return v11_mutate(text, rng)


def joined_call_id(text: str, calls: list[Call]) -> bool:
    """A vLLM call named ``NAMEID`` where the text writes ``NAME[CALL_ID]ID``."""
    written = re.findall(r"\[TOOL_CALLS\]([^\[{]*)\[CALL_ID\]([^\[{]*)", text)
    return any(name + id_ in (n for n, _ in calls) for name, id_ in written)


MAGISTRAL_DIFFERENCES = (
    Difference(
        "call_id_joined_to_the_name",
        "vLLM's mistral tokenizer mode hands its tool parser the content without the [CALL_ID] "
        "control token: a call as mistral-common's v11 encoder writes it is named 'NAMEID' "
        "there; titoflow reads the name and the id (rendered back into history)",
        joined_call_id,
        refusal=False,
    ),
    *(d for d in V11_DIFFERENCES if d.name != "call_id_in_the_name"),
)


FAMILY = Family(
    "magistral",
    "mistral",
    "mistral",
    MISTRAL_TOOLS,
    ("[TOOL_CALLS]",),
    MAGISTRAL_DIFFERENCES,
    MAGISTRAL_VLLM + MAGISTRAL_WRITES,
    mutants(magistral_bases(), magistral_mutate, 80),
    tekken=tekken_v11,
)

# The outputs Magistral commonly writes that are calls, without error.
READS = {
    "reasoned_with_call_id": ["read_file"],
    "reasoned_args_marker_no_id": ["read_file"],
    "call_inside_reasoning": ["read_file"],
    "call_inside_reasoning_then_its_closer": ["read_file"],
}

"""Nemotron 3's cases for the parser parity test. vLLM serves Nemotron 3 Nano with the
``qwen3_coder`` tool parser after a reasoning parser (its model card's ``--tool-call-parser
qwen3_coder``); vLLM 0.32 ships that reasoning parser as ``nemotron_v3``, Qwen3's with ChatML's
turn boundaries and the reasoning's trailing whitespace stripped. The template's generation
prompt opens ``<think>``, so the model's output starts inside the reasoning, which it ends with
``\\n</think>\\n`` (the template's layout). The tokenizer is the family's labelled stand-in
(tekken's vocabulary with Nemotron 3's markers, cli/dev/tokenizers/nemotron3.py)."""

from __future__ import annotations

from tests.support.parity import Case, Family, mutants
from tests.support.parity.qwen3_coder import (
    CODER_DIFFERENCES,
    CODER_MALFORMED,
    CODER_VLLM,
    EDIT,
    coder_bases,
)
from tests.support.parity.qwen35 import (
    QWEN35_TOOLS,
    RECOVERY_BLOCK,
    RECOVERY_VLLM,
    qwen35_mutate,
)

# vLLM tests/reasoning/test_nemotron_v3_reasoning_parser.py, commit
# a3d7831f627cf4d6933d12b3149020936ca1d2ad, model outputs verbatim (no calls: both read none).
NEMOTRON3_VLLM = [
    Case("vllm_without_start_token", "This is a reasoning section</think>This is the rest", True),
    Case("vllm_with_start_token", "<think>This is a reasoning section</think>This is the rest"),
    Case("vllm_truncated_reasoning", "This is truncated reasoning", True),
]

# What a Nemotron 3 model writes after the reasoning its prompt opened.
REASONED = "Let me work it out.\n</think>\n"


def reasoned(cases: list[Case], prefix: str) -> list[Case]:
    """Qwen3-Coder's cases as a Nemotron 3 model writes them: after its reasoning."""
    return [Case(f"{prefix}_{case.name}", REASONED + case.text, True) for case in cases]


# What Nemotron 3 models write around their calls: the template's own turn (content, a newline,
# the call), a call opened while thinking, thinking off (the prompt wrote <think></think>).
NEMOTRON3_MALFORMED = [
    Case("content_then_call", f"{REASONED}Editing.\n{EDIT}\n", True),
    Case("call_before_think_close", f"I should edit it.\n{EDIT}\n</think>\n", True),
    Case("call_in_never_closed_think", f"Let me edit it.\n{EDIT}", True),
    Case("thinking_off_call", f"\n{EDIT}\n"),
    Case("two_calls", f"{REASONED}{EDIT}\n{RECOVERY_BLOCK}\n", True),
    Case(
        "function_closer_missing_before_next_call",
        REASONED + EDIT.replace("</function>\n", "") + "\n" + RECOVERY_BLOCK,
        True,
    ),
]


def nemotron3_bases() -> list[tuple[str, bool]]:
    return [
        *((REASONED + text, True) for text, _ in coder_bases()),
        (f"Both.\n{EDIT}\n{RECOVERY_BLOCK}\n</think>\n", True),
    ]


FAMILY = Family(
    "nemotron3",
    "qwen3_coder",
    "nemotron_v3",
    QWEN35_TOOLS,
    ("<tool_call>", "<function="),
    CODER_DIFFERENCES,
    NEMOTRON3_VLLM
    + RECOVERY_VLLM
    + reasoned(CODER_VLLM, "coder")
    + reasoned(CODER_MALFORMED, "coder")
    + NEMOTRON3_MALFORMED,
    mutants(nemotron3_bases(), qwen35_mutate, 80),
)

READS = {
    "content_then_call": ["edit"],
    "call_before_think_close": ["edit"],
    "call_in_never_closed_think": ["edit"],
    "thinking_off_call": ["edit"],
    "two_calls": ["edit", "Finish"],
    "function_closer_missing_before_next_call": ["edit", "Finish"],
}

"""Qwen3.5/3.6's cases for the parser parity test. vLLM serves Qwen3.5 with the ``qwen3_coder``
tool parser after its ``qwen3`` reasoning parser (the model card's ``--tool-call-parser
qwen3_coder --reasoning-parser qwen3``): the reasoning parser hands the tool parser the content,
and a ``<tool_call>`` opened before ``</think>`` ends the reasoning there. The template's
generation prompt opens ``<think>``, so the model's output starts inside the reasoning. The
tokenizer is the family's (Qwen3.5's vocabulary, cli/dev/tokenizers/qwen35.py)."""

from __future__ import annotations

import random

from tests.support.parity import (
    Case,
    Family,
    drop_one,
    mutants,
    recovery_cases,
    tool,
)
from tests.support.parity.qwen3_coder import (
    CODER_DIFFERENCES,
    CODER_MALFORMED,
    CODER_TOOLS,
    CODER_VLLM,
    EDIT,
    coder_bases,
    coder_mutate,
)

QWEN35_TOOLS = [*CODER_TOOLS, tool("Finish", {"answer": {"type": "string"}})]

RECOVERY_BLOCK = (
    "<tool_call>\n<function=Finish>\n<parameter=answer>\n204\n</parameter>\n</function>\n"
    "</tool_call>"
)
RECOVERY_VLLM = recovery_cases(RECOVERY_BLOCK, full=True)

# What a Qwen3.5 model writes after the reasoning its prompt opened (the template's own
# layout: the reasoning, "\n</think>\n\n", then the answer).
REASONED = "Let me work it out.\n</think>\n\n"


def reasoned(cases: list[Case], prefix: str) -> list[Case]:
    """Qwen3-Coder's cases as a Qwen3.5 model writes them: after its reasoning."""
    return [Case(f"{prefix}_{case.name}", REASONED + case.text, True) for case in cases]


# What Qwen3.5 models commonly write around their calls.
QWEN35_MALFORMED = [
    Case("call_before_think_close", f"I should edit it.\n{EDIT}\n</think>\n\n", True),
    Case("call_in_never_closed_think", f"Let me edit it.\n\n{EDIT}", True),
    Case(
        "calls_before_think_close_then_text", f"Both.\n{EDIT}\n{RECOVERY_BLOCK}</think>Done.", True
    ),
    Case("thinking_off_call", f"<think>\n\n</think>\n\n{EDIT}"),
    Case(
        "function_closer_missing_before_next_call",
        REASONED + EDIT.replace("</function>\n", "") + "\n" + RECOVERY_BLOCK,
        True,
    ),
    Case(
        "call_mentioned_in_reasoning", f"I will use <function=edit> next.\n</think>\n\n{EDIT}", True
    ),
]


def qwen35_bases() -> list[tuple[str, bool]]:
    return [
        *((REASONED + text, True) for text, _ in coder_bases()),
        (f"Both.\n{EDIT}\n{RECOVERY_BLOCK}\n</think>", True),
    ]


def qwen35_mutate(text: str, rng: random.Random) -> str:
    """Qwen3-Coder's mutations, or the reasoning's closer dropped."""
    if rng.random() < 0.2:
        return drop_one(text, "</think>", rng)
    return coder_mutate(text, rng)


FAMILY = Family(
    "qwen35",
    "qwen3_coder",
    "qwen3",
    QWEN35_TOOLS,
    ("<tool_call>", "<function="),
    CODER_DIFFERENCES,
    RECOVERY_VLLM
    + reasoned(CODER_VLLM, "coder")
    + reasoned(CODER_MALFORMED, "coder")
    + QWEN35_MALFORMED,
    mutants(qwen35_bases(), qwen35_mutate, 80),
)

READS = {
    "coder_bare_function": ["edit"],
    "coder_bare_function_stray_closer": ["edit"],
    "coder_missing_parameter_closer": ["edit"],
    "coder_unclosed_final_block": ["edit"],
    "coder_no_function_closer": ["edit"],
    "coder_no_tool_call_closer": ["edit"],
    "coder_two_functions_one_block": ["edit", "edit"],
    "call_before_think_close": ["edit"],
    "call_in_never_closed_think": ["edit"],
    "calls_before_think_close_then_text": ["edit", "Finish"],
    "thinking_off_call": ["edit"],
    "function_closer_missing_before_next_call": ["edit", "Finish"],
}

"""Qwen3.5/3.6's cases for the parser parity test. vLLM serves Qwen3.5 with the ``qwen3_coder``
tool parser after its ``qwen3`` reasoning parser (the model card's ``--tool-call-parser
qwen3_coder --reasoning-parser qwen3``): the reasoning parser hands the tool parser the content,
and a ``<tool_call>`` opened before ``</think>`` ends the reasoning there. The template's
generation prompt opens ``<think>``, so the model's output starts inside the reasoning. The
tokenizer is the family's (Qwen3.5's vocabulary, cli/dev/tokenizers/qwen35.py)."""

from __future__ import annotations

import random

from tests.titoflow.tito.parity import Case, Family, drop_one, mutants, tool
from tests.titoflow.tito.parity.qwen3_coder import (
    CODER_DIFFERENCES,
    CODER_MALFORMED,
    CODER_TOOLS,
    CODER_VLLM,
    EDIT,
    coder_bases,
    coder_mutate,
)

QWEN35_TOOLS = [*CODER_TOOLS, tool("Finish", {"answer": {"type": "string"}})]

# vLLM tests/reasoning/test_qwen3_tool_call_recovery.py, commit
# 50e9a157fa59b72ad3b91662dce21f15711a6762 (issue 39056: Qwen3.5 writing its XML call inside
# <think>), model outputs verbatim.
RECOVERY_BLOCK = (
    "<tool_call>\n<function=Finish>\n<parameter=answer>\n204\n</parameter>\n</function>\n"
    "</tool_call>"
)
RECOVERY_VLLM = [
    Case(
        "vllm_embedded_tool_call_promoted_from_reasoning",
        "<think>The verification confirms my solution:\n- s = 2.5 km/h\n- t = 24 minutes\n"
        "- Total time at speed 3 km/h = 204 minutes\n\n" + RECOVERY_BLOCK + "\n</think>",
    ),
    Case(
        "vllm_existing_content_preserved_after_promotion",
        "<think>verify result\n" + RECOVERY_BLOCK + "</think>Here is the answer.",
    ),
    Case(
        "vllm_promoted_tool_call_parseable_trailing_text",
        "<think>verify result\n" + RECOVERY_BLOCK + "</think>assistant trailing text",
    ),
    # Cut off before </think> with no <think> written: the prompt opened it.
    Case("vllm_truncated_reasoning_recovers_tool_call", "verify result\n" + RECOVERY_BLOCK, True),
    Case(
        "vllm_normal_reasoning_unchanged",
        "<think>Let me think about this carefully.\nThe answer is 42.</think>The answer is 42.",
    ),
    Case("vllm_post_think_content_preserved", "<think>some reasoning</think>plain response text"),
]

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
    """Well-formed outputs to mutate: (text, reasoning_open)."""
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

# The outputs these models commonly write that are calls, without error (the bugs of issue 37).
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

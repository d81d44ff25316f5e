"""Magistral v13's cases for the parser parity test (Magistral Small 2507/2509). vLLM's parser
is given vLLM's own ``MistralTokenizer`` over the v13 ``tekken.json`` (``tokenizer_mode=mistral``,
as Magistral's model card serves it), where ``[THINK]`` and ``[/THINK]`` are control tokens:
vLLM 0.32's ``mistral`` reasoning parser then reads them as its reasoning markers (its
``special_token`` encoding, chosen wherever ``[THINK]`` is in the vocabulary).

The cases are ``magistral``'s with v13's markers: vLLM's own reasoning test outputs verbatim
(they are v13's), then the calls v11 and v13 models write after a reasoning block, a call opened
inside it, reasoning cut off, and 80 mutations. The declared differences are ``magistral``'s.
"""

from __future__ import annotations

import random

from cli.dev.tokenizers.magistral_v13 import tekken_v13
from tests.support.parity import Case, Family, cut_after, drop_one, magistral, mutants
from tests.support.parity.magistral import (
    MAGISTRAL_DIFFERENCES,
    MAGISTRAL_VLLM,
    MAGISTRAL_WRITES,
    magistral_bases,
)
from tests.support.parity.mistral import MISTRAL_TOOLS
from tests.support.parity.mistral_v11 import v11_mutate


def v13(text: str) -> str:
    """``text`` with v11's ``<think>`` text markers written as v13's control tokens."""
    return text.replace("<think>", "[THINK]").replace("</think>", "[/THINK]")


def v13_mutate(text: str, rng: random.Random) -> str:
    op = rng.choice(["v11", "v11", "cut", "drop"])
    if op == "cut":  # cut anywhere, the reasoning too
        return cut_after(text, "[THINK]", rng)
    if op == "drop":
        return drop_one(text, rng.choice(["[THINK]", "[/THINK]"]), rng)
    return v11_mutate(text, rng)


# vLLM tests/reasoning/test_mistral_reasoning_parser.py, commit
# 04dbd8f32c4dc8ef1254eeaabd154a225948cf57: its outputs verbatim (magistral's module writes
# their [THINK]/[/THINK] as v11's text; here they are as vLLM's test writes them).
MAGISTRAL_V13_VLLM = [Case(case.name, v13(case.text)) for case in MAGISTRAL_VLLM]
MAGISTRAL_V13_WRITES = [Case(case.name, v13(case.text)) for case in MAGISTRAL_WRITES]

FAMILY = Family(
    "magistral_v13",
    "mistral",
    "mistral",
    MISTRAL_TOOLS,
    ("[TOOL_CALLS]",),
    MAGISTRAL_DIFFERENCES,
    MAGISTRAL_V13_VLLM + MAGISTRAL_V13_WRITES,
    mutants([(v13(text), opened) for text, opened in magistral_bases()], v13_mutate, 80),
    tekken=tekken_v13,
)

# The outputs Magistral commonly writes that are calls, without error: magistral's.
READS = magistral.READS

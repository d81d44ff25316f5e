"""DeepSeek-V3.2's template held to DeepSeek's own encoder, the judge: DeepSeek ships no chat
template for V3.2, only ``encoding_dsv32.py``, which vLLM 0.32 runs in its ``deepseek_v32``
tokenizer mode (``vllm/tokenizers/deepseek_v32.py``: the tools as a first system message, chat or
thinking mode, past reasoning dropped when the last message is a user's). The family serves
llama.cpp's port with pinned edits (cli/dev/tokenizers/deepseek_v32.py).

Every prompt of the family corpus (each prefix ending where a prompt is served: a user message or
tool results) and each whole conversation (history), in chat and in thinking mode, is rendered by
both, the encoder in the engine environment. The texts must be equal once the declared rewrites
are applied, each a named difference with its reason that must still occur; a conversation the
encoder refuses must be one the declared refusal names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.support.encoder_judge import Case, Compared, compare

LOAD = """
from vllm.tokenizers.deepseek_v32 import DeepseekV32Tokenizer
tok = DeepseekV32Tokenizer.from_pretrained(request["tokenizer"])
"""


# --- the declared differences --------------------------------------------------------------------


def _later_system_dropped(ours: str, theirs: str, case: Case) -> tuple[str, str]:
    for message in case.messages[1:]:
        if message.role == "system" and message.content not in ours:
            theirs = theirs.replace(message.content, "", 1)
    return ours, theirs


@dataclass(frozen=True)
class Rewrite:
    name: str
    reason: str
    apply: Callable[[str, str, Case], tuple[str, str]]


REWRITES = (
    Rewrite(
        "later_system_dropped",
        "the port writes a system message after the first nowhere (no branch of its loop takes "
        "it); the encoder writes its content in place, with no header",
        _later_system_dropped,
    ),
)
# The encoder's one refusal: in thinking mode, an assistant turn after the last user message
# must carry reasoning or calls; the port writes such a turn with an empty reasoning block.
REFUSAL = "ThinkingMode: thinking, invalid message without reasoning/tool_calls"


@pytest.fixture(scope="module")
def compared() -> list[Compared]:
    return compare("deepseek_v32", LOAD)


def test_the_template_writes_what_deepseeks_encoder_writes(compared: list[Compared]) -> None:
    occurred = dict.fromkeys([r.name for r in REWRITES], 0)
    equal = refused = 0
    for found in compared:
        case, ours, theirs = found.case, found.ours, found.theirs
        if found.verdict == "refused":
            assert theirs.startswith(REFUSAL) and case.thinking, (case.name, theirs)
            assert case.messages[-1].role == "assistant", case.name
            refused += 1
            continue
        equal += ours == theirs
        for rewrite in REWRITES:
            rewritten = rewrite.apply(ours, theirs, case)
            if rewritten != (ours, theirs):
                occurred[rewrite.name] += 1
            ours, theirs = rewritten
        assert ours == theirs, case.name
    print(
        f"\ndeepseek_v32 template vs encoder: {len(compared)} prompts, {equal} equal, "
        f"{len(compared) - equal - refused} equal after rewrites {occurred}, {refused} refused"
    )
    assert not [name for name, count in occurred.items() if not count], occurred
    assert refused > 0, "the declared refusal no longer occurs"
    assert equal > 0

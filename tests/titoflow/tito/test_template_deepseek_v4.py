"""DeepSeek-V4's template (titoflow's own, cli/dev/tokenizers/templates/deepseek_v4.jinja) held to
DeepSeek's own encoder, the judge: DeepSeek ships no chat template for V4, only
``encoding_dsv4.py``, which vLLM 0.32 runs in its ``deepseek_v4`` tokenizer mode
(``vllm/tokenizers/deepseek_v4.py``: the tools on the first system message, chat or thinking
mode, the reasoning effort that mode picks, tool results merged into user turns, past reasoning
dropped without tools).

Every prompt of the family corpus and each whole conversation, in chat and in thinking mode, with
the conversation's tools and without them (without, past reasoning is dropped), parallel calls'
results given out of order, and a prompt under each reasoning effort, is rendered by both, the
encoder in the engine environment: the texts must be equal, with no rewrite declared and no
refusal. Not judged here: a request naming neither ``thinking`` nor ``enable_thinking``, which
the template renders in chat mode and vLLM's mode in thinking mode (docs/models.md says why).
"""

from __future__ import annotations

import json

import pytest

from tests.support.encoder_judge import Case, Compared, compare
from tests.support.families import function_tool
from titoflow.tito.messages import Message, ToolCall

LOAD = """
from vllm.tokenizers.deepseek_v4 import DeepseekV4Tokenizer
tok = DeepseekV4Tokenizer.from_pretrained(request["tokenizer"])
"""


def results_out_of_order() -> list[Case]:
    """Parallel calls answered last first (the encoder writes the results in call order), then
    a user message in the same turn, in both modes."""
    calls = tuple(
        ToolCall(id=f"call_{i}", name="run", arguments=json.dumps({"command": c}))
        for i, c in enumerate(("ls", "pwd", "id"))
    )
    messages = (
        Message(role="user", content="Look around."),
        Message(role="assistant", content="", tool_calls=calls),
        *(Message(role="tool", tool_call_id=c.id, content=f"out {c.id}") for c in calls[::-1]),
        Message(role="user", content="And then?"),
    )
    tools = (function_tool("run", {"command": {"type": "string"}}),)
    return [
        Case(f"results-out-of-order[:{end}]/{mode}", messages[:end], tools, mode == "thinking")
        for end in (5, 6)
        for mode in ("chat", "thinking")
    ]


def efforts() -> list[Case]:
    """A conversation's first prompt under each reasoning effort vLLM's mode reads, in both
    modes ("none" turns thinking off; "max" has its own prefix; the rest are low or high)."""
    messages = (Message(role="system", content="Be brief."), Message(role="user", content="Hi."))
    return [
        Case(
            f"effort-{effort}/{mode}",
            messages,
            (),
            mode == "thinking",
            (("reasoning_effort", effort),),
        )
        for effort in ("none", "minimal", "low", "medium", "high", "max", "xhigh")
        for mode in ("chat", "thinking")
    ]


@pytest.fixture(scope="module")
def compared() -> list[Compared]:
    extra = [*results_out_of_order(), *efforts()]
    return compare("deepseek_v4", LOAD, toolless=True, extra=extra)


def test_the_template_writes_what_deepseeks_encoder_writes(compared: list[Compared]) -> None:
    for found in compared:
        assert found.verdict == "text", (found.case.name, found.theirs)
        assert found.ours == found.theirs, found.case.name
    modes = {found.case.thinking for found in compared}
    tools = sum(bool(found.case.tools) for found in compared)
    print(f"\ndeepseek_v4 template vs encoder: {len(compared)} prompts equal ({tools} with tools)")
    assert modes == {False, True} and 0 < tools < len(compared)

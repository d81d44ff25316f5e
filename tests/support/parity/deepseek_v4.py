"""DeepSeek-V4's cases for the parser parity test: vLLM serves V4 with its ``deepseek_v4`` tool
and reasoning parsers (one DSML state machine, ``vllm/parser/deepseek_v4.py``), which without the
request's ``thinking`` switch (so here: vLLM 0.32 then takes thinking mode) read an output as
starting inside the reasoning, ended by ``</think>`` or by a ``<｜DSML｜tool_calls>`` block; so
every case is read with the reasoning open, as titoflow reads an output after a thinking-mode
prompt. The parsers are given the family's directory, where ``｜DSML｜`` is one token; they
read the text."""

from __future__ import annotations

from tests.support.parity import Case, Family, dsml, mutants, tool
from tests.support.parity.dsml import DSML, block, invoke, param, run

START, END = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"
STRING = {"type": "string"}
TOOLS = [
    # The tools vLLM's V4 parser tests call, typed as their values read.
    tool("get_weather", {"location": STRING, "unit": STRING}),
    tool("get_time", {"timezone": STRING}),
    dsml.RUN_TOOL,
]


def calls(*invocations: str) -> str:
    return block("tool_calls", *invocations)


def packed(*invocations: str) -> str:
    """A block as vLLM's own V4 tests write it: no newline after the opener or before the
    closer."""
    return START + "\n".join(invocations) + END


NYC = param("location", "true", "NYC")
# vLLM tests/parser/engine/test_deepseek_v4.py, commit d7a7d80992b302db96844dbdd429d66bef87ecf8:
# the model outputs of its tool and reasoning tests.
VLLM = [
    Case(
        "vllm_missing_invoke_end",
        f'{START}<{DSML}invoke name="get_weather">\n{NYC}\n{END}',
        True,
    ),
    Case(
        "vllm_missing_invoke_end_trailing_content",
        f'{START}<{DSML}invoke name="get_weather">\n{NYC}\n{END}Done.',
        True,
    ),
    Case(
        "vllm_unwrap_parallel_all_props",
        packed(
            invoke(
                "get_weather",
                param("arguments", "false", '{"location": "NYC", "unit": "celsius"}'),
            ),
            invoke("get_time", param("timezone", "true", "EST")),
        ),
        True,
    ),
    Case(
        "vllm_unwrap_parallel_subset_props",
        packed(
            invoke("get_weather", param("arguments", "false", '{"location": "NYC"}')),
            invoke("get_time", param("timezone", "true", "EST")),
        ),
        True,
    ),
    Case("vllm_bare_think_end", "</think>Here is the direct answer.", True),
    Case("vllm_duplicate_think_start", "<think>\nSome reasoning.\n</think>\nAnswer.", True),
    Case(
        "vllm_reasoning_without_tags",
        "\n\nLet me consider this carefully.\n</think>\nHere is the result.",
        True,
    ),
    Case("vllm_all_reasoning_no_end_tag", "I'll review the PR.", True),
]

# A turn as the template writes it after the prompt's <think>: reasoning, content, the block.
RUN = calls(run())
TURN = "List the files.</think>I'll look.\n\n" + RUN

# What V4 models commonly write instead.
MALFORMED = [
    Case("call_ends_reasoning", "List the files.\n\n" + RUN, True),
    Case("bare_invoke", "List.</think>Sure.\n\n" + run(), True),
    Case("v32_block_name", TURN.replace("tool_calls>", "function_calls>"), True),
    # The misspelt openers vLLM's parser takes for the block (DSML_TOOL_START_VARIANTS: "observed
    # in production"); titoflow reads the invoke inside as a bare one, the opener as text.
    Case("opener_toolcalls", TURN.replace(START, f"<{DSML}toolcalls>"), True),
    Case("opener_tool", TURN.replace(START, f"<{DSML}tool>"), True),
    *dsml.malformed("tool_calls", TURN, True),
]


def bases() -> list[tuple[str, bool]]:
    two = calls(run(), run("5"))
    return [(TURN, True), ("Two at once.</think>\n\n" + two, True), (RUN, True)]


FAMILY = Family(
    "deepseek_v4",
    "deepseek_v4",
    "deepseek_v4",
    TOOLS,
    (START, f"<{DSML}invoke name="),
    dsml.DIFFERENCES,
    VLLM + MALFORMED,
    mutants(bases(), dsml.mutate("tool_calls"), 80),
)

READS = {
    **dsml.READS,
    "call_ends_reasoning": ["run"],
    "bare_invoke": ["run"],
    "v32_block_name": ["run"],
    "opener_toolcalls": ["run"],
    "opener_tool": ["run"],
}

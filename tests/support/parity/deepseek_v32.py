"""DeepSeek-V3.2's cases for the parser parity test: vLLM serves V3.2 with its ``deepseek_v32``
tool parser (the DSML parser engine, ``vllm/parser/deepseek_v32.py``) after the ``deepseek_v3``
reasoning parser, which without the request's ``thinking`` switch (so here) passes the output
through as content; the thinking-mode cases end their reasoning before the block, so both
readings of them agree. The markers are text in V3.2's vocabulary, so the parsers read text."""

from __future__ import annotations

from tests.support.parity import Case, Family, dsml, mutants, tool
from tests.support.parity.dsml import DSML, block, invoke, param, run

START, END = f"<{DSML}function_calls>", f"</{DSML}function_calls>"
STRING = {"type": "string"}
TOOLS = [
    # The tools vLLM's V3.2 parser tests call, typed as their values read.
    tool("get_weather", {"city": STRING, "location": STRING}),
    tool("search", {"q": STRING}),
    tool("toggle", {"enabled": {"type": "boolean"}, "count": {"type": "integer"}}),
    tool("fn", {"k": STRING}),
    tool("fn_a", {"x": STRING}),
    tool("fn_b", {"y": STRING}),
    dsml.RUN_TOOL,
]


def func_calls(*invocations: str) -> str:
    return block("function_calls", *invocations)


# vLLM tests/parser/engine/test_deepseek_v32.py, commit
# fb73c46585e8f5567e4555b277961aa67fc08792: the model outputs, built by its own helpers.
VLLM = [
    Case("vllm_no_tool_call", "Hello world"),
    Case("vllm_single_tool", func_calls(invoke("get_weather", param("city", "true", "SF")))),
    Case(
        "vllm_parallel_tools",
        func_calls(
            invoke("get_weather", param("city", "true", "SF")),
            invoke("get_weather", param("city", "true", "NYC")),
        ),
    ),
    Case(
        "vllm_content_before_tool_call",
        "Let me check. " + func_calls(invoke("search", param("q", "true", "vllm"))),
    ),
    Case(
        "vllm_non_string_params_json_parsed",
        func_calls(
            invoke("toggle", param("enabled", "false", "true"), param("count", "false", "42"))
        ),
    ),
    Case(
        "vllm_wrapper_unwrapping",
        func_calls(invoke("get_weather", param("arguments", "false", '{"location":"Beijing"}'))),
    ),
    Case(
        "vllm_content_before_tool_streaming",
        "Checking... " + func_calls(invoke("fn", param("k", "true", "v"))),
    ),
    Case(
        "vllm_parallel_tools_streaming",
        func_calls(
            invoke("fn_a", param("x", "true", "1")), invoke("fn_b", param("y", "true", "2"))
        ),
    ),
    Case(
        "vllm_missing_invoke_end",
        f'{START}\n<{DSML}invoke name="fn">\n{param("k", "true", "v")}\n{END}',
    ),
]

# A turn as the template writes it: content, a blank line, the block.
RUN = func_calls(run())
TURN = "I'll look.\n\n" + RUN

# What V3.2 models commonly write instead.
MALFORMED = [
    Case("thinking_then_call", "List the files.</think>I'll look.\n\n" + RUN, True),
    Case("bare_invoke", "Sure.\n\n" + run()),
    *dsml.malformed("function_calls", TURN, False),
]


def bases() -> list[tuple[str, bool]]:
    two = func_calls(run(), run("5"))
    return [(TURN, False), ("Two at once.\n\n" + two, False), (RUN, False)]


FAMILY = Family(
    "deepseek_v32",
    "deepseek_v32",
    "deepseek_v3",
    TOOLS,
    (START, f"<{DSML}invoke name="),
    dsml.DIFFERENCES,
    VLLM + MALFORMED,
    mutants(bases(), dsml.mutate("function_calls"), 80),
)

READS = {**dsml.READS, "thinking_then_call": ["run"], "bare_invoke": ["run"]}

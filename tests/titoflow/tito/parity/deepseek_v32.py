"""DeepSeek-V3.2's cases for the parser parity test: vLLM serves V3.2 with its ``deepseek_v32``
tool parser (the DSML parser engine, ``vllm/parser/deepseek_v32.py``) after the ``deepseek_v3``
reasoning parser, which without the request's ``thinking`` switch (so here) passes the output
through as content; the thinking-mode cases end their reasoning before the block, so both
readings of them agree. The markers are text in V3.2's vocabulary, so the parsers read text."""

from __future__ import annotations

import json
import random
import re

from tests.titoflow.tito.parity import (
    Call,
    Case,
    Difference,
    Family,
    cut_after,
    drop_one,
    json_object,
    mutants,
    space_after,
    swap_two,
    tool,
)

DSML = "｜DSML｜"
START, END = f"<{DSML}function_calls>", f"</{DSML}function_calls>"
STRING = {"type": "string"}
DEEPSEEK_V32_TOOLS = [
    # The tools vLLM's V3.2 parser tests call, typed as their values read.
    tool("get_weather", {"city": STRING, "location": STRING}),
    tool("search", {"q": STRING}),
    tool("toggle", {"enabled": {"type": "boolean"}, "count": {"type": "integer"}}),
    tool("fn", {"k": STRING}),
    tool("fn_a", {"x": STRING}),
    tool("fn_b", {"y": STRING}),
    tool("run", {"command": STRING, "timeout": {"type": "integer"}, "env": {"type": "object"}}),
]


def param(name: str, is_str: str, value: str) -> str:
    return f'<{DSML}parameter name="{name}" string="{is_str}">{value}</{DSML}parameter>'


def invoke(name: str, *params: str) -> str:
    body = "\n".join(params)
    return f'<{DSML}invoke name="{name}">\n{body}\n</{DSML}invoke>'


def func_calls(*invocations: str) -> str:
    return START + "\n" + "\n".join(invocations) + "\n" + END


# vLLM tests/parser/engine/test_deepseek_v32.py, commit
# fb73c46585e8f5567e4555b277961aa67fc08792: the model outputs, built by its own helpers.
DEEPSEEK_V32_VLLM = [
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
RUN = func_calls(
    invoke(
        "run",
        param("command", "true", "ls -la\ncat x"),
        param("timeout", "false", "30"),
        param("env", "false", '{"A": "1"}'),
    )
)
TURN = "I'll look.\n\n" + RUN
INVOKE = RUN.removeprefix(START + "\n").removesuffix("\n" + END)

# What V3.2 models commonly write instead.
DEEPSEEK_V32_MALFORMED = [
    Case("thinking_then_call", "List the files.</think>I'll look.\n\n" + RUN, True),
    Case("unclosed_final_block", TURN.removesuffix(END)),
    Case("no_invoke_closer", TURN.replace(f"</{DSML}invoke>\n", "")),
    Case("missing_parameter_closer", TURN.replace(f"cat x</{DSML}parameter>", "cat x")),
    Case("bare_invoke", "Sure.\n\n" + INVOKE),
    Case("two_blocks", TURN + "\n\n" + RUN.replace(">30<", ">5<")),
    Case("false_value_not_json", TURN.replace(">30<", ">soon<")),
    Case("string_attribute_missing", TURN.replace(' string="false">30', ">30")),
    Case(
        "parameter_given_twice",
        TURN.replace(
            param("timeout", "false", "30"),
            param("timeout", "false", "30") + "\n" + param("timeout", "false", "5"),
        ),
    ),
    Case("unknown_tool", TURN.replace('"run"', '"delete_everything"')),
    Case("cut_inside_a_value", TURN[: TURN.index("cat x") + 3]),
]


def deepseek_v32_bases() -> list[tuple[str, bool]]:
    two = RUN.replace("\n" + END, "\n" + INVOKE.replace(">30<", ">5<") + "\n" + END)
    return [(TURN, False), ("Two at once.\n\n" + two, False), (RUN, False)]


CLOSERS = (f"</{DSML}parameter>", f"</{DSML}invoke>", END)


def deepseek_v32_mutate(text: str, rng: random.Random) -> str:
    op = rng.choice(["truncate", "drop", "space", "reorder"])
    if op == "truncate":
        return cut_after(text, START, rng)
    if op == "drop":
        return drop_one(text, rng.choice(CLOSERS), rng)
    if op == "space":
        return space_after(text, f"</?{DSML}(function_calls|invoke|parameter)[^>]*>", rng)
    return swap_two(text, f"<{DSML}parameter name=[^>]*>.*?</{DSML}parameter>\n", rng)


def params_of(text: str) -> list[str]:
    return re.findall(f'<{DSML}parameter name="([^"]*)"', text)


def false_values_not_json(text: str) -> bool:
    for value in re.findall(f'string="false">([^<]*)</{DSML}parameter>', text):
        try:
            json.loads(value)
        except ValueError:
            return True
    return False


def dsml_parameters_lost(text: str, calls: list[Call]) -> bool:
    """vLLM's calls hold fewer parameters than the text begins."""
    found = sum(len(json.loads(arguments)) for _, arguments in calls if json_object(arguments))
    return found < text.count(f"<{DSML}parameter")


def value_end_unknown(text: str, calls: list[Call]) -> bool:
    """vLLM's calls hold fewer parameters than the text begins, or a value runs into its
    invoke's closer (which vLLM ends it at)."""
    into_closer = f'<{DSML}parameter name="[^"]*"[^>]*>(?:(?!</?{DSML}parameter).)*?</{DSML}invoke>'
    return dsml_parameters_lost(text, calls) or re.search(into_closer, text, re.DOTALL) is not None


def next_invoke_merged(text: str, calls: list[Call]) -> bool:
    """Fewer calls than invokes, one of them missing its closer before the next."""
    invokes = text.split(f"<{DSML}invoke name=")[1:]
    unclosed = any(f"</{DSML}invoke>" not in block for block in invokes[:-1])
    return unclosed and len(calls) < len(invokes)


DEEPSEEK_V32_DIFFERENCES = (  # the first that applies names the case: the specific first
    Difference(
        "parameter_given_twice",
        "vLLM keeps the last value of a parameter written twice; titoflow does not guess which",
        lambda text, calls: any(
            len(set(params_of(block))) < len(params_of(block))
            for block in text.split(f"<{DSML}invoke")
        ),
    ),
    Difference(
        "next_invoke_merged",
        "an invoke whose </｜DSML｜invoke> is missing before the next: vLLM reads the next "
        "invoke's parameters into it and loses the next call; titoflow refuses",
        next_invoke_merged,
    ),
    Difference(
        "false_value_not_json",
        'a value marked string="false" that is not JSON: vLLM passes it as a string, against '
        "the mark; titoflow refuses rather than guess which of the two is wrong",
        lambda text, calls: false_values_not_json(text),
    ),
    Difference(
        "string_attribute_missing",
        "a parameter without its string attribute: vLLM reads the value as JSON where it "
        'parses, else as text (so 30 and "30" read alike); titoflow refuses the guess',
        lambda text, calls: re.search(f'<{DSML}parameter name="[^"]*"\\s*>', text) is not None,
    ),
    Difference(
        "cut_inside_a_tag",
        "the output ends inside a tag ('<｜DSML｜para', '</｜DSML｜invok'): vLLM drops the partial "
        "tag and calls the tool; titoflow refuses, the model having been cut off writing more "
        "of the call",
        lambda text, calls: re.search(r"<[^>]*$", text) is not None,
    ),
    Difference(
        "value_end_unknown",
        "a parameter with no known end (cut off in its value, or its value running into "
        "</｜DSML｜invoke> or the block's end): vLLM drops the parameter and calls the tool "
        "without it, or ends the value at </｜DSML｜invoke>; titoflow refuses rather than call "
        "with an argument missing or guessed",
        value_end_unknown,
    ),
    Difference(
        "wrapper_unwrapped",
        'a call whose only parameter is "arguments" (or "input") holding the declared ones: '
        "vLLM unwraps it into them; titoflow returns the call as the model wrote it",
        lambda text, calls: 'parameter name="arguments"' in text,
        refusal=False,
    ),
)


FAMILY = Family(
    "deepseek_v32",
    "deepseek_v32",
    "deepseek_v3",
    DEEPSEEK_V32_TOOLS,
    (START, f"<{DSML}invoke name="),
    DEEPSEEK_V32_DIFFERENCES,
    DEEPSEEK_V32_VLLM + DEEPSEEK_V32_MALFORMED,
    mutants(deepseek_v32_bases(), deepseek_v32_mutate, 80),
)

# The outputs these models commonly write that are calls, without error.
READS = {
    "thinking_then_call": ["run"],
    "unclosed_final_block": ["run"],
    "no_invoke_closer": ["run"],
    "missing_parameter_closer": ["run"],
    "bare_invoke": ["run"],
    "two_blocks": ["run", "run"],
}

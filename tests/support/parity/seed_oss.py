"""Seed-OSS's cases for the parser parity test. vLLM serves it with the ``seed_oss`` tool and
reasoning parsers (its ``qwen3`` parser under Seed's tags), which read an output as starting
inside a reasoning block (the model opens ``<seed:think>`` itself; the template's generation
prompt does not) and end the reasoning at ``</seed:think>`` or a ``<seed:tool_call>``. The
tokenizer is the family's stand-in (cli/dev/tokenizers/seed_oss.py): the markers are
single tokens as in Seed-OSS's vocabulary."""

from __future__ import annotations

from tests.support.parity import (
    Case,
    Difference,
    Family,
    cut_inside_a_tag,
    mutants,
    mutator,
    parameter_given_twice,
    parameters_lost,
    tool,
)

STRING = {"type": "string"}
SEED_TOOLS = [
    tool("get_weather", {"location": STRING, "unit": STRING}),
    tool("run", {"command": STRING, "timeout": {"type": "integer"}, "env": {"type": "object"}}),
]


def block(name: str, **params: str) -> str:
    """A call as the template writes it."""
    inner = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<seed:tool_call>\n<function={name}>\n{inner}</function>\n</seed:tool_call>"


BARCELONA = block("get_weather", location="Barcelona, Spain")
# vLLM tests/tool_parsers/test_seed_oss_tool_parser.py, commit
# 0f120751344c09af442c1800020908d2b7ff71f2: its model outputs (thinking budgets 0, 512 and
# unlimited), shortened where only reasoning text is cut.
SEED_VLLM = [
    Case("vllm_no_tools", "This is a test response without any tool calls"),
    Case("vllm_budget_0", BARCELONA),
    Case(
        "vllm_budget_0_streamed",
        "<seed:think>\n</seed:cot_budget_reflect>\n</seed:cot_budget_reflect>\nThe current "
        "thinking budget is 0, so I will directly start answering the question.\n</seed:think>\n"
        + BARCELONA,
    ),
    Case(
        "vllm_budget_512",
        "<seed:think>The user's current thinking budget is 512.</seed:cot_budget_reflect>\nLet "
        "me analyze the question.\n<seed:cot_budget_reflect>I have used 131 tokens, and there "
        "are 381 tokens remaining for use.</seed:cot_budget_reflect>\n The unit parameter can be "
        "omitted since it's optional.</seed:think>\n" + BARCELONA,
    ),
    Case(
        "vllm_budget_unlimited",
        "<seed:think>\nGot it, let's see. Let me format the function call correctly. The format "
        "is <seed:tool_call>\n<function=get_weather>\n<parameter=location>Barcelona, "
        "Spain</parameter>\n<parameter=unit>celsius</parameter>\n</function>\n</seed:tool_call>. "
        "Let me go with that.</seed:think><seed:tool_call>\n<function=get_weather>\n"
        "<parameter=location>Barcelona, Spain</parameter>\n<parameter=unit>celsius</parameter>\n"
        "</function>\n</seed:tool_call>",
    ),
]

RUN = block("run", command="ls -la\ncat x", timeout="30", env='{"A": "1"}')
TURN = "<seed:think>List the files.</seed:think>\nI'll look.\n\n" + RUN
FUNCTION = RUN.removeprefix("<seed:tool_call>\n").removesuffix("\n</seed:tool_call>")

# What Seed-OSS models commonly write instead (Qwen3-Coder's XML slips, under Seed's tags).
SEED_MALFORMED = [
    Case("call_before_think_close", "<seed:think>List the files.\n" + RUN + "</seed:think>"),
    Case("no_think_block", "I'll look.\n" + RUN),
    Case("unclosed_final_block", TURN.removesuffix("</seed:tool_call>")),
    Case("no_function_closer", TURN.replace("</function>\n", "")),
    Case("missing_parameter_closer", TURN.replace("cat x</parameter>", "cat x")),
    Case("bare_function", "<seed:think>R</seed:think>\n" + FUNCTION),
    Case("two_blocks", TURN + "\n" + RUN.replace("30", "5")),
    Case("value_runs_into_function_closer", TURN.replace('"1"}</parameter>', '"1"}')),
    Case(
        "parameter_given_twice",
        TURN.replace(
            "<parameter=timeout>", "<parameter=command>x</parameter>\n<parameter=timeout>"
        ),
    ),
    Case("cut_inside_a_value", TURN[: TURN.index("cat x") + 3]),
    # The template writes an object argument with Jinja's string filter: a model trained on it
    # writes the Python literal.
    Case("python_literal_object", TURN.replace('{"A": "1"}', "{'A': '1', 'B': None}")),
]

seed_mutate = mutator(
    "<seed:tool_call>",
    ("</parameter>", "</function>", "</seed:tool_call>", "</seed:think>"),
    r"</?(seed:tool_call|function|parameter)[^>]*>",
)


def seed_bases() -> list[tuple[str, bool]]:
    two = TURN + "\n" + block("get_weather", location="Oslo", unit="celsius")
    return [(TURN, False), (two, False), (RUN, False)]


SEED_DIFFERENCES = (
    parameter_given_twice(lambda text, calls: "<parameter=command>x</parameter>" in text),
    Difference(
        "value_end_unknown",
        "a parameter with no known end (cut off in its name or value, or its value running "
        "into </function>): vLLM drops the parameter or keeps the text so far; titoflow "
        "refuses rather than call with an argument missing or guessed",
        lambda text, calls: parameters_lost(text, calls) or text.rstrip().endswith(("cat", "ls")),
    ),
    cut_inside_a_tag("'<', '</fu'"),
    Difference(
        "next_block_merged",
        "a block whose </function> is missing, followed by another block: vLLM reads the next "
        "block's parameters into the first call (its grammar has no </seed:tool_call> inside "
        "arguments) and loses the second; titoflow ends the first call at its block's end and "
        "returns both",
        lambda text, calls: (
            len(calls) < text.count("<function=")
            and any("</function>" not in b for b in text.split("<seed:tool_call>")[1:-1])
        ),
        refusal=False,
    ),
    Difference(
        "python_literal_read",
        "an object or array argument written as a Python literal, as the template writes one "
        "(Jinja's string filter): vLLM passes the text on as a string, titoflow reads the "
        "literal when it is of the schema's type",
        lambda text, calls: "{'" in text,
        refusal=False,
    ),
)

FAMILY = Family(
    "seed_oss",
    "seed_oss",
    "seed_oss",
    SEED_TOOLS,
    ("<seed:tool_call>", "<function="),
    SEED_DIFFERENCES,
    SEED_VLLM + SEED_MALFORMED,
    mutants(seed_bases(), seed_mutate, 80),
)

READS = {
    "call_before_think_close": ["run"],
    "no_think_block": ["run"],
    "unclosed_final_block": ["run"],
    "no_function_closer": ["run"],
    "missing_parameter_closer": ["run"],
    "bare_function": ["run"],
    "two_blocks": ["run", "run"],
    "python_literal_object": ["run"],
}

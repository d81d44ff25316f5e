"""Qwen3-Coder's cases for the parser parity test (vLLM serves it with the tool parser alone:
it does not reason)."""

from __future__ import annotations

from tests.support.parity import (
    Case,
    Difference,
    Family,
    mutants,
    mutator,
    swapping,
    tool,
    xml_parameter_differences,
)

CODER_TOOLS = [
    # vLLM's sample_tools (test_qwen3coder_tool_parser.py)
    tool(
        "get_current_weather",
        {
            "city": {"type": "string"},
            "state": {"type": "string"},
            "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
        },
    ),
    tool(
        "calculate_area",
        {
            "shape": {"type": "string"},
            "dimensions": {"type": "object"},
            "precision": {"type": "integer"},
        },
    ),
    tool(
        "edit",
        {"path": {"type": "string"}, "line": {"type": "integer"}, "text": {"type": "string"}},
    ),
]

# vLLM tests/tool_parsers/test_qwen3coder_tool_parser.py, commit
# c8e462c487ef33d25414e838b308e6f76bb01286, model outputs verbatim.
DALLAS = (
    "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
    "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n"
    "</function>\n</tool_call>"
)
CODER_VLLM = [
    Case("vllm_no_tools", "This is a test response without any tool calls"),
    Case("vllm_single_tool", DALLAS),
    Case("vllm_single_tool_with_content", "Sure! Let me check the weather for you." + DALLAS),
    Case(
        "vllm_single_tool_multiline_param",
        "<tool_call>\n<function=calculate_area>\n<parameter=shape>\nrectangle\n</parameter>\n"
        '<parameter=dimensions>\n{"width": 10, \n "height": 20}\n</parameter>\n'
        "<parameter=precision>\n2\n</parameter>\n</function>\n</tool_call>",
    ),
    Case(
        "vllm_parallel_tools",
        DALLAS + "\n" + DALLAS.replace("Dallas", "Orlando").replace("TX", "FL"),
    ),
    Case(
        "vllm_tool_with_typed_params",
        "Let me calculate that area for you.<tool_call>\n<function=calculate_area>\n"
        '<parameter=shape>\ncircle\n</parameter>\n<parameter=dimensions>\n{"radius": 15.5}\n'
        "</parameter>\n<parameter=precision>\n3\n</parameter>\n</function>\n</tool_call>",
    ),
    Case(
        "vllm_fallback_no_tags",
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
        "<parameter=state>\nTX\n</parameter>\n</function>",
    ),
    Case(
        "vllm_missing_closing_parameter_tag",
        "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n"
        "<parameter=city>\nDallas\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\n"
        "fahrenheit\n</parameter>\n</function>\n</tool_call>",
    ),
    Case(
        "vllm_missing_opening_tag",
        "I'll check the weather for you.\n\n<function=get_current_weather>\n"
        "<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n"
        "<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>",
    ),
    Case(
        "vllm_whitespace_before_tool_call",
        "\n\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
        "</parameter>\n<parameter=state>\nTX\n</parameter>\n</function>\n</tool_call>",
    ),
]

EDIT = (
    "<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
    "<parameter=line>\n3\n</parameter>\n<parameter=text>\nx = 1\n</parameter>\n"
    "</function>\n</tool_call>"
)

# What Qwen3-Coder models commonly write instead.
CODER_MALFORMED = [
    Case(
        "bare_function",
        "I'll edit it.\n" + EDIT.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"),
    ),
    Case("bare_function_stray_closer", EDIT.removeprefix("<tool_call>\n") + "\nDone."),
    Case("missing_parameter_closer", EDIT.replace("src/a.py\n</parameter>", "src/a.py\n")),
    Case("unclosed_final_block", "Editing.\n" + EDIT.removesuffix("</function>\n</tool_call>")),
    Case("no_function_closer", EDIT.replace("</function>\n", "")),
    Case("no_tool_call_closer", EDIT.removesuffix("</tool_call>")),
    Case("two_functions_one_block", EDIT.replace("</function>\n", "</function>\n" + EDIT[12:-13])),
    Case("value_cut_off", EDIT[: EDIT.index("x = 1") + 3]),
    Case("value_runs_into_function_closer", EDIT.replace("x = 1\n</parameter>", "x = 1\n")),
    Case(
        "parameter_given_twice",
        EDIT.replace("<parameter=line>", "<parameter=path>\nb\n</parameter>\n<parameter=line>"),
    ),
]


def coder_bases() -> list[tuple[str, bool]]:
    return [
        (EDIT, False),
        ("Let me edit.\n" + EDIT + "\n" + DALLAS, False),
        (DALLAS, False),
    ]


coder_mutate = mutator(
    "<",
    ("</parameter>", "</function>", "</tool_call>", "<tool_call>"),
    r"</?(tool_call|function|parameter)[^>]*>",
    swapping(r"<parameter=[^>]*>\n.*?\n</parameter>\n"),  # parameters in another order
)


CODER_DIFFERENCES = (
    *xml_parameter_differences(
        r"<parameter=([^>\n]*)>", "<function=", "</function>", "'<', '</func'"
    ),
    Difference(
        "function_closer_missing_mid_output",
        "a block missing its </function> with another block after it: vLLM reads the first "
        "function on into the next block, merging both calls' parameters into one call; "
        "titoflow ends the function at its block's </tool_call>, two calls as written",
        lambda text, calls: (
            text.count("</function>") < text.count("<function=")
            and len(calls) < text.count("<function=")
        ),
        refusal=False,
    ),
)


FAMILY = Family(
    "qwen3_coder",
    "qwen3_coder",
    None,  # Qwen3-Coder does not reason; vLLM serves it with the tool parser alone
    CODER_TOOLS,
    ("<tool_call>", "<function="),
    CODER_DIFFERENCES,
    CODER_VLLM + CODER_MALFORMED,
    mutants(coder_bases(), coder_mutate, 80),
)

READS = {
    "bare_function": ["edit"],
    "bare_function_stray_closer": ["edit"],
    "missing_parameter_closer": ["edit"],
    "unclosed_final_block": ["edit"],
    "no_function_closer": ["edit"],
    "no_tool_call_closer": ["edit"],
    "two_functions_one_block": ["edit", "edit"],
}

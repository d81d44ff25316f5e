"""MiniMax-M2's cases for the parser parity test: vLLM serves it with the ``minimax_m2`` tool
parser after the ``minimax_m2`` reasoning parser, which reads the output as starting inside the
reasoning block its generation prompt opened (``]~b]ai\\n<think>\\n``): every case is read so."""

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

STRING = {"type": "string"}
MINIMAX_TOOLS = [
    # The tools of vLLM's test_minimax_m2_tool_parser.py cases (its parser drops a call to a
    # tool the request does not declare), typed as their values read.
    tool("get_weather", {"city": STRING, "days": {"type": "integer"}}),
    tool("search_web", {"query": STRING}),
    tool("fn_a", {"x": {"type": "integer"}}),
    tool("fn_b", {"y": {"type": "integer"}}),
    tool("get_stock", {"ticker": STRING}),
    tool("fn", {"k": STRING, "a": {"type": "integer"}}),
    tool("update_profile", {"nickname": {"anyOf": [STRING, {"type": "null"}]}}),
    tool("update_settings", {"config": {"anyOf": [{"type": "object"}, {"type": "null"}]}}),
    tool("run", {"command": STRING, "timeout": {"type": "integer"}, "env": {"type": "object"}}),
]


def section(*invokes: str) -> str:
    return "<minimax:tool_call>" + "".join(invokes) + "</minimax:tool_call>"


def invoke(name: str, **params: str) -> str:
    inner = "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in params.items())
    return f'<invoke name="{name}">{inner}</invoke>'


# vLLM tests/tool_parsers/test_minimax_m2_tool_parser.py, commit
# 0c927c3451653f28e60cd552cff13ddc3c9ff49e: the model outputs its streamed chunks join to.
MINIMAX_VLLM = [
    Case("vllm_plain_content", "Hello world", True),
    Case(
        "vllm_content_before_tool_call",
        "Let me check. " + section(invoke("get_weather", city="Seattle")),
        True,
    ),
    Case("vllm_single_invoke", section(invoke("get_weather", city="Seattle")), True),
    Case("vllm_multiple_params", section(invoke("get_weather", city="Seattle", days="5")), True),
    Case(
        "vllm_two_invokes",
        section(invoke("search_web", query="OpenAI"), invoke("search_web", query="Gemini")),
        True,
    ),
    Case(
        "vllm_two_invokes_in_single_delta",
        section(invoke("fn_a", x="1"), invoke("fn_b", y="2")),
        True,
    ),
    Case(
        "vllm_different_functions",
        section(invoke("get_weather", city="NYC"), invoke("get_stock", ticker="AAPL")),
        True,
    ),
    Case("vllm_tool_call_fields", section(invoke("fn", k="v")), True),
    Case("vllm_prev_tool_call_arr_single", section(invoke("fn", a="1")), True),
    Case("vllm_anyof_nullable_non_null", section(invoke("update_profile", nickname="Alice")), True),
    Case("vllm_anyof_nullable_null", section(invoke("update_profile", nickname="null")), True),
    Case(
        "vllm_anyof_nullable_object",
        section(invoke("update_settings", config='{"theme": "dark", "fontSize": 14}')),
        True,
    ),
]

# A turn as MiniMax-M2 writes it after the generation prompt's "<think>\n" (the template's layout).
RUN = (
    '<minimax:tool_call>\n<invoke name="run">\n<parameter name="command">ls -la\n'
    'cat x</parameter>\n<parameter name="timeout">30</parameter>\n'
    '<parameter name="env">{"A": "1"}</parameter>\n</invoke>\n</minimax:tool_call>'
)
TURN = "List the files.\n</think>\n\nI'll look.\n" + RUN
INVOKE = RUN.removeprefix("<minimax:tool_call>\n").removesuffix("\n</minimax:tool_call>")

# What MiniMax-M2 models commonly write instead.
MINIMAX_MALFORMED = [
    Case("call_before_think_close", "List the files." + RUN + "\n</think>\n\nDone.", True),
    Case("unclosed_final_section", TURN.removesuffix("</minimax:tool_call>"), True),
    Case("no_invoke_closer", TURN.replace("</invoke>\n", ""), True),
    Case("missing_parameter_closer", TURN.replace("cat x</parameter>", "cat x"), True),
    Case("bare_invoke", "Sure.\n</think>\n\n" + INVOKE, True),
    Case(
        "bare_invoke_stray_closer", "Sure.\n</think>\n\n" + INVOKE + "\n</minimax:tool_call>", True
    ),
    Case("single_quoted_name", TURN.replace('"run"', "'run'"), True),
    Case("two_sections", TURN + "\n" + RUN.replace("30", "5"), True),
    Case("value_runs_into_invoke_closer", TURN.replace('"1"}</parameter>', '"1"}'), True),
    Case(
        "parameter_given_twice",
        TURN.replace(
            '<parameter name="timeout">',
            '<parameter name="command">x</parameter>\n<parameter name="timeout">',
        ),
        True,
    ),
    Case("unknown_tool", TURN.replace('"run"', '"delete_everything"'), True),
    Case("cut_inside_a_value", TURN[: TURN.index("cat x") + 3], True),
]


def minimax_bases() -> list[tuple[str, bool]]:
    two = RUN.replace(
        "\n</minimax:tool_call>", "\n" + INVOKE.replace("30", "5") + "\n</minimax:tool_call>"
    )
    return [(TURN, True), ("Two at once.\n</think>\n\n" + two, True), (RUN, True)]


minimax_mutate = mutator(
    "<minimax:tool_call>",
    ("</parameter>", "</invoke>", "</minimax:tool_call>", "</think>"),
    r"</?(minimax:tool_call|invoke|parameter)[^>]*>",
    swapping(r'<parameter name="[^"]*">.*?</parameter>\n'),  # parameters in another order
)


MINIMAX_DIFFERENCES = (
    *xml_parameter_differences(r"<parameter name=([^>]*)>", "<invoke", "</invoke>", "'<', '</inv'"),
    Difference(
        "undeclared_tool_kept",
        "vLLM drops a call to a tool the request does not declare; titoflow returns the call as "
        "the model wrote it (the client sees what its policy did)",
        lambda text, calls: "delete_everything" in text,
        refusal=False,
    ),
    Difference(
        "nullable_string_null",
        "a string-or-null parameter written as null: vLLM reads it as null, titoflow as the "
        "text 'null' (the template writes a null value as null and a string as itself, so the "
        "text is ambiguous; titoflow keeps what was written)",
        lambda text, calls: ">null</parameter>" in text,
        refusal=False,
    ),
)


FAMILY = Family(
    "minimax_m2",
    "minimax_m2",
    "minimax_m2",
    MINIMAX_TOOLS,
    ("<minimax:tool_call>", "<invoke name="),
    MINIMAX_DIFFERENCES,
    MINIMAX_VLLM + MINIMAX_MALFORMED,
    mutants(minimax_bases(), minimax_mutate, 80),
)

READS = {
    "call_before_think_close": ["run"],
    "unclosed_final_section": ["run"],
    "no_invoke_closer": ["run"],
    "missing_parameter_closer": ["run"],
    "bare_invoke": ["run"],
    "bare_invoke_stray_closer": ["run"],
    "single_quoted_name": ["run"],
    "two_sections": ["run", "run"],
}

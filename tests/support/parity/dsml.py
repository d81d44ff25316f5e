"""DeepSeek's DSML calls for the parser parity test, whatever the block's name (V3.2's
``function_calls``, V4's ``tool_calls``): the builders of an output, the mutation, and the
differences titoflow declares from vLLM's DSML parser engine, which reads both alike, and the
malformed outputs both families' models commonly write around a ``run`` call."""

from __future__ import annotations

import json
import re

from tests.support.parity import (
    Call,
    Case,
    Difference,
    Mutate,
    cut_inside_a_tag,
    json_object,
    mutator,
    names_a_parameter_twice,
    parameter_given_twice,
    swapping,
    tool,
)

DSML = "｜DSML｜"
INVOKE_CLOSE = f"</{DSML}invoke>"
RUN_TOOL = tool(
    "run",
    {"command": {"type": "string"}, "timeout": {"type": "integer"}, "env": {"type": "object"}},
)


def param(name: str, is_str: str, value: str) -> str:
    return f'<{DSML}parameter name="{name}" string="{is_str}">{value}</{DSML}parameter>'


def invoke(name: str, *params: str) -> str:
    body = "\n".join(params)
    return f'<{DSML}invoke name="{name}">\n{body}\n{INVOKE_CLOSE}'


def block(name: str, *invocations: str) -> str:
    """The ``name`` block of ``invocations``, one a line, as the templates write it."""
    return f"<{DSML}{name}>\n" + "\n".join(invocations) + f"\n</{DSML}{name}>"


def run(timeout: str = "30") -> str:
    """The invoke of :data:`RUN_TOOL` the malformed cases are made from: a string value with a
    newline, a number, an object."""
    return invoke(
        "run",
        param("command", "true", "ls -la\ncat x"),
        param("timeout", "false", timeout),
        param("env", "false", '{"A": "1"}'),
    )


def malformed(name: str, turn: str, reasoning_open: bool) -> list[Case]:
    """What models commonly write instead of ``turn``, a turn ending in :func:`run` in the
    ``name`` block, each read with the reasoning open or not; titoflow reads the first four as
    calls (:data:`READS`)."""
    param_twice = param("timeout", "false", "30") + "\n" + param("timeout", "false", "5")
    outputs = [
        ("unclosed_final_block", turn.removesuffix(f"</{DSML}{name}>")),
        ("no_invoke_closer", turn.replace(f"{INVOKE_CLOSE}\n", "")),
        ("missing_parameter_closer", turn.replace(f"cat x</{DSML}parameter>", "cat x")),
        ("two_blocks", turn + "\n\n" + block(name, run("5"))),
        ("false_value_not_json", turn.replace(">30<", ">soon<")),
        ("string_attribute_missing", turn.replace(' string="false">30', ">30")),
        ("parameter_given_twice", turn.replace(param("timeout", "false", "30"), param_twice)),
        ("unknown_tool", turn.replace('"run"', '"delete_everything"')),
        ("cut_inside_a_value", turn[: turn.index("cat x") + 3]),
    ]
    return [Case(case, text, reasoning_open) for case, text in outputs]


READS = {
    "unclosed_final_block": ["run"],
    "no_invoke_closer": ["run"],
    "missing_parameter_closer": ["run"],
    "two_blocks": ["run", "run"],
}


def mutate(name: str) -> Mutate:
    """Cut after the block's opener, a closer dropped, whitespace after a tag, parameters
    swapped."""
    return mutator(
        f"<{DSML}{name}>",
        (f"</{DSML}parameter>", INVOKE_CLOSE, f"</{DSML}{name}>"),
        f"</?{DSML}({name}|invoke|parameter)[^>]*>",
        swapping(f"<{DSML}parameter name=[^>]*>.*?</{DSML}parameter>\n"),
    )


def false_values_not_json(text: str) -> bool:
    for value in re.findall(f'string="false">([^<]*)</{DSML}parameter>', text):
        try:
            json.loads(value)
        except ValueError:
            return True
    return False


def parameters_lost(text: str, calls: list[Call]) -> bool:
    """vLLM's calls hold fewer parameters than the text begins."""
    found = sum(len(json.loads(arguments)) for _, arguments in calls if json_object(arguments))
    return found < text.count(f"<{DSML}parameter")


def value_end_unknown(text: str, calls: list[Call]) -> bool:
    """vLLM's calls hold fewer parameters than the text begins, or a value runs into its
    invoke's closer (which vLLM ends it at)."""
    into_closer = f'<{DSML}parameter name="[^"]*"[^>]*>(?:(?!</?{DSML}parameter).)*?{INVOKE_CLOSE}'
    return parameters_lost(text, calls) or re.search(into_closer, text, re.DOTALL) is not None


def next_invoke_merged(text: str, calls: list[Call]) -> bool:
    """Fewer calls than invokes, one of them missing its closer before the next."""
    invokes = text.split(f"<{DSML}invoke name=")[1:]
    unclosed = any(INVOKE_CLOSE not in invocation for invocation in invokes[:-1])
    return unclosed and len(calls) < len(invokes)


DIFFERENCES = (
    parameter_given_twice(
        names_a_parameter_twice(f'<{DSML}parameter name="([^"]*)"', f"<{DSML}invoke")
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
    cut_inside_a_tag("'<｜DSML｜para', '</｜DSML｜invok'"),
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
        lambda text, calls: (
            'parameter name="arguments"' in text or 'parameter name="input"' in text
        ),
        refusal=False,
    ),
)

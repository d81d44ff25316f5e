"""Llama 4's cases for the parser parity test. vLLM serves Llama 4 with pythonic calls through
the ``llama4_pythonic`` tool parser alone (the family does not reason); its tokenizer is Meta's
own vocabulary, where ``<|python_start|>`` is a special token."""

from __future__ import annotations

import random
import re

from tests.support.parity import Case, Difference, Family, cut_after, drop_one, mutants, tool

STRING = {"type": "string"}
LLAMA4_TOOLS = [
    # The functions vLLM's llama4_pythonic parser tests call, and the corpus's.
    tool("get_weather", {"city": STRING, "metric": STRING}),
    tool("register_user", {"name": STRING, "age": {"type": "integer"}}),
    tool("do_something_cool", {"steps": {"type": "array"}}),
    tool("calc", {"x": {"type": "number"}}),
    tool("run", {"command": STRING, "timeout": {"type": "integer"}, "env": {"type": "object"}}),
    tool("list_dir", {}),
]

# vLLM tests/tool_parsers/test_llama4_pythonic_tool_parser.py, commit
# 0716d268c7d81e445bd9ae30205f7bf4cfacd7d5, model outputs verbatim.
SIMPLE = "[get_weather(city='LA', metric='C')]"
INNER = "get_weather(city='LA', metric='C')"
LLAMA4_VLLM = [
    Case("vllm_no_tool_call", "How can I help you today?"),
    Case("vllm_simple", SIMPLE),
    Case(
        "vllm_more_types",
        "[register_user(name='Doe', age=9, address={'city': 'LA', 'state': 'CA'}, role=None, "
        "passed_test=True, aliases=['John', 'Johnny'])]",
    ),
    Case("vllm_parameterless", "[get_weather()]"),
    Case("vllm_empty_dict", "[do_something_cool(additional_data={})]"),
    Case("vllm_empty_list", "[do_something_cool(steps=[])]"),
    Case(
        "vllm_escaped_string",
        r"[get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')]",
    ),
    Case("vllm_parallel", "[get_weather(city='LA',metric='C'),register_user(name='Doe',age=9)]"),
    Case("vllm_python_tag", "<|python_start|>" + SIMPLE + "<|python_end|>"),
    Case(
        "vllm_python_tag_parallel",
        "<|python_start|>[get_weather(city='LA', metric='C'), register_user(name='Doe', age=9)]",
    ),
    Case(
        "vllm_large_steps",
        "<|python_start|>[get_weather(city='LA', metric='C'), get_weather(), "
        "do_something_cool(steps=[])]<|python_end|>",
    ),
    Case("vllm_regex_timeout_input", "hello world[A(A=" + "\t)A(A=,\t" * 2),
    Case("vllm_bad_sibling", f"<|python_start|>[bad(x=b'z'), {INNER}]<|python_end|>"),
    Case("vllm_non_finite", f"<|python_start|>[calc(x=1e999), {INNER}]<|python_end|>"),
    Case("vllm_mismatched_brackets", "<|python_start|>[foo(x=1])]<|python_end|>"),
]

# A turn as the template writes one, and as Llama 4 writes its own.
RUN = "[run(command=\"ls -la\", timeout=30, env={'A': '1'})]"
TWO = '[run(command="ls"), list_dir()]'

# What Llama 4 models commonly write instead.
LLAMA4_MALFORMED = [
    Case("json_literals", '[run(command="ls", env={"A": null, "B": true})]'),
    Case("negative_number", "[calc(x=-1.5)]"),
    Case("tuple_and_set", "[do_something_cool(steps=(1, 2))]"),
    Case("trailing_newline", RUN + "\n"),
    Case("text_before", "Let me look. " + RUN),
    Case("text_after", RUN + " Done."),
    Case("positional_argument", '[run("ls")]'),
    Case("expression_value", "[calc(x=1 + 2)]"),
    Case("unclosed_list", RUN.removesuffix("]")),
    Case("dotted_name", '[tools.run(command="ls")]'),
    Case("undeclared_tool", '[delete_everything(path="/")]'),
    Case("leading_space", " " + RUN),
    Case("python_start_unclosed", "<|python_start|>" + TWO),
]


def llama4_bases() -> list[tuple[str, bool]]:
    return [(RUN, False), (TWO, False), ("<|python_start|>" + TWO + "<|python_end|>", False)]


def llama4_mutate(text: str, rng: random.Random) -> str:
    op = rng.choice(["truncate", "drop", "space", "reorder"])
    if op == "truncate":
        return cut_after(text, "[", rng)
    if op == "drop":
        return drop_one(text, rng.choice([")", "]", '"', ",", "<|python_end|>"]), rng)
    if op == "space":
        spots = [m.end() for m in re.finditer(r"[\[(,=]", text)]
        at = rng.choice(spots)
        return text[:at] + rng.choice([" ", "\n", "  "]) + text[at:]
    # Keyword arguments in another order.
    args = re.findall(r"\w+=(?:\"[^\"]*\"|\{[^}]*\}|\d+)", text)
    if len(args) < 2:
        return text
    first, second = rng.sample(args, 2)
    return text.replace(first, "\0").replace(second, first).replace("\0", second)


LLAMA4_DIFFERENCES = (
    Difference(
        "non_finite_number",
        "a number that overflows to infinity (1e999): vLLM 0.32 passes it as Infinity, which "
        "is not JSON; titoflow refuses the call list with parse_error",
        lambda text, calls: "1e999" in text,
    ),
    Difference(
        "whitespace_read",
        "a call list with whitespace before it, after its '[' or after a call's '(': vLLM's "
        "pattern admits none there, so it returns the text; titoflow reads the calls (Python "
        "reads the list so, and the template's own instruction does not forbid it)",
        lambda text, calls: not calls and re.search(r"^\s|\[\s|\(\s", text) is not None,
        refusal=False,
    ),
)

FAMILY = Family(
    "llama4",
    "llama4_pythonic",
    None,
    LLAMA4_TOOLS,
    ("[run(", "[get_weather(", "<|python_start|>"),
    LLAMA4_DIFFERENCES,
    LLAMA4_VLLM + LLAMA4_MALFORMED,
    mutants(llama4_bases(), llama4_mutate, 80),
)

READS = {
    "json_literals": ["run"],
    "negative_number": ["calc"],
    "tuple_and_set": ["do_something_cool"],
    "trailing_newline": ["run"],
    "python_start_unclosed": ["run", "list_dir"],
}

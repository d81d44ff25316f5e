"""Gemma 3's cases for the parser parity test. vLLM serves Gemma 3 with tool calls through its
``tool_chat_template_gemma3_pythonic.jinja`` and the ``pythonic`` tool parser alone (the family
does not reason); its tokenizer is the labelled stand-in (Qwen3's vocabulary with Gemma's
markers), which the pythonic parser does not read. The mutations and tools are Llama 4's, whose
parser Gemma 3's refines; only ``[`` opens a call (Gemma has no python tag)."""

from __future__ import annotations

from tests.support.parity import Case, Family, mutants
from tests.support.parity.llama4 import LLAMA4_DIFFERENCES, LLAMA4_TOOLS, RUN, TWO, llama4_mutate

# vLLM tests/tool_parsers/test_pythonic_tool_parser.py, commit
# 0716d268c7d81e445bd9ae30205f7bf4cfacd7d5, model outputs verbatim.
SIMPLE = "get_weather(city='San Francisco', metric='celsius')"
MORE_TYPES = (
    "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
    "role=None, passed_test=True, aliases=['John', 'Johnny'])"
)
GEMMA3_VLLM = [
    Case("vllm_no_tool_call", "How can I help you today?"),
    Case("vllm_simple", f"[{SIMPLE}]"),
    Case("vllm_more_types", f"[{MORE_TYPES}]"),
    Case("vllm_parameterless", "[get_weather()]"),
    Case("vllm_empty_dict", "[do_something_cool(additional_data={})]"),
    Case("vllm_empty_list", "[do_something_cool(steps=[])]"),
    Case(
        "vllm_escaped_string",
        r"[get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')]",
    ),
    Case("vllm_parallel", f"[{SIMPLE}, {MORE_TYPES}]"),
    Case("vllm_regex_timeout_input", "hello world[A(A=" + "\t)A(A=,\t" * 2),
    Case("vllm_bad_sibling", f"[bad(x=b'z'), {SIMPLE}]"),
    Case("vllm_non_finite", f"[calc(x=1e999), {SIMPLE}]"),
    Case("vllm_unparsable_sibling", f"[{SIMPLE}, f(a='x 'y', b='z')]"),
    Case("vllm_unrecoverable", "[f(a='x 'y' 'z), g(b='p 'q' 'r)]"),
    Case("vllm_mismatched_brackets", "[foo(x=1])]"),
]

# What Gemma 3 commonly writes instead, and what its template's history teaches it.
GEMMA3_MALFORMED = [
    Case("json_literals", '[run(command="ls", env={"A": null, "B": true})]'),
    Case("negative_number", "[calc(x=-1.5)]"),
    Case("trailing_newline", RUN + "\n"),
    Case("text_before", "Let me look. " + RUN),
    Case("text_after", RUN + " Done."),
    Case("markdown_fence", "```python\n" + RUN + "\n```"),
    Case("tool_code_fence", "```tool_code\n" + TWO + "\n```"),
    Case("bare_call", 'run(command="ls")'),
    Case("positional_argument", '[run("ls")]'),
    Case("unclosed_list", RUN.removesuffix("]")),
    Case("undeclared_tool", '[delete_everything(path="/")]'),
    # The template writes a call's arguments without commas (its loop-scoped flag).
    Case("history_without_commas", '[run(command="ls"timeout=30)]'),
    Case("python_tag", "<|python_start|>" + TWO + "<|python_end|>"),
]


def gemma3_bases() -> list[tuple[str, bool]]:
    return [(RUN, False), (TWO, False), (f"[{SIMPLE}, {MORE_TYPES}]", False)]


FAMILY = Family(
    "gemma3",
    "pythonic",
    None,
    LLAMA4_TOOLS,
    ("[run(", "[get_weather(", "[register_user("),
    LLAMA4_DIFFERENCES,
    GEMMA3_VLLM + GEMMA3_MALFORMED,
    mutants(gemma3_bases(), llama4_mutate, 80),
)

READS = {
    "json_literals": ["run"],
    "negative_number": ["calc"],
    "trailing_newline": ["run"],
}

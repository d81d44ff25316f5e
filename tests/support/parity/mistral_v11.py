"""Mistral v11's cases for the parser parity test. Its tokenizer is the family's directory (the
tekken vocabulary with ``[ARGS]`` and ``[CALL_ID]``, loaded by vLLM's ``AutoTokenizer`` as in its
``hf`` mode): with ``[ARGS]`` in the vocabulary, vLLM's Mistral parser runs in its v11 mode
(``[TOOL_CALLS]NAME[ARGS]{...}`` or ``NAME{...}``, each call behind its own marker).

Found on the way and declared: that mode has no ``[CALL_ID]`` terminal, so a call written as
mistral-common's v11 encoder and Small 3.2's template write it
(``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}``) comes out of vLLM named ``NAME[CALL_ID]ID``.
"""

from __future__ import annotations

import json
import random
import re

from tests.support.parity import (
    READ_ARGUMENTS,
    Call,
    Case,
    Difference,
    Family,
    mutants,
)
from tests.support.parity.mistral import (
    MISTRAL_READ,
    MISTRAL_TOOLS,
    SF,
    mistral_mutator,
    text_after_the_calls,
)

# vLLM tests/tool_parsers/test_mistral_tool_parser.py, commit
# 002d5731d3ee99b92d80b103be81c212245f1acf, the v11 model outputs verbatim (the ids v11-*).
V11_VLLM = [
    Case("vllm_v11_single_tool_add", '[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}'),
    Case("vllm_v11_single_tool_weather", "[TOOL_CALLS]get_current_weather" + SF),
    Case(
        "vllm_v11_multiple_tool_calls",
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
    ),
    Case("vllm_v11_content_before_tool", 'bla[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}'),
    Case(
        "vllm_v11_complex",
        'hi{hi[TOOL_CALLS]bash{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"}',
    ),
]

ID = "[CALL_ID]Zz9Yy8Xx7"
WEATHER = "[TOOL_CALLS]get_current_weather" + ID + "[ARGS]" + SF

# What v11 models and templates write: mistral-common's and Small 3.2's format (with the id),
# v13's and Devstral's (without), and the malformed outputs a policy writes.
V11_MALFORMED = [
    Case("with_call_id", "[TOOL_CALLS]read_file[CALL_ID]a1B2c3D4e[ARGS]" + READ_ARGUMENTS),
    Case("args_marker_no_id", "[TOOL_CALLS]read_file[ARGS]" + READ_ARGUMENTS),
    Case(
        "content_then_two_calls",
        "Let me look.[TOOL_CALLS]read_file[ARGS]" + READ_ARGUMENTS + WEATHER,
    ),
    Case("space_before_arguments", "[TOOL_CALLS]read_file[ARGS] " + READ_ARGUMENTS),
    Case("empty_arguments", "[TOOL_CALLS]list_dir[ARGS]{}"),
    Case(
        "unicode_and_nested_arguments",
        '[TOOL_CALLS]bash[ARGS]{"command": "echo \'naïve 漢字 🙂\'", "env": {"A": [1, null]}}',
    ),
    Case("newlines_before_the_calls", 'Checking.\n\n[TOOL_CALLS]get_age[ARGS]{"name": "Ann"}'),
    Case("call_cut_off", "[TOOL_CALLS]read_file[ARGS]" + READ_ARGUMENTS[:12]),
    Case("no_arguments", "[TOOL_CALLS]list_dir[ARGS]"),
    Case(
        "text_after_the_arguments", "[TOOL_CALLS]read_file[ARGS]" + READ_ARGUMENTS + " I will wait."
    ),
    Case("arguments_as_a_json_string", '[TOOL_CALLS]get_age[ARGS]"{\\"name\\": \\"Ann\\"}"'),
    Case("call_without_a_name", "[TOOL_CALLS][ARGS]" + READ_ARGUMENTS),
    Case("name_with_a_space", "[TOOL_CALLS]read file[ARGS]" + READ_ARGUMENTS),
    Case("openai_style_id", "[TOOL_CALLS]read_file[CALL_ID]call_0[ARGS]" + READ_ARGUMENTS),
    Case("v7_json_list", f"[TOOL_CALLS][{MISTRAL_READ}]"),
]


def v11_bases() -> list[tuple[str, bool]]:
    return [
        ("[TOOL_CALLS]read_file[ARGS]" + READ_ARGUMENTS, False),
        (
            "Let me check.[TOOL_CALLS]read_file[ARGS]" + READ_ARGUMENTS + WEATHER.replace(ID, ""),
            False,
        ),
        ('[TOOL_CALLS]add{"a": 3.5, "b": 4}', False),
    ]


def v11_own(text: str, rng: random.Random) -> str:
    op = rng.choice(["lead", "form", "trail"])
    if op == "lead":  # text before the calls
        return rng.choice(["Sure. ", "Let me check.\n", "On it: "]) + text
    if op == "form":  # NAME[ARGS]{...} and NAME{...}, both v11 (vLLM's tests write the second)
        if "[ARGS]{" in text:
            return text.replace("[ARGS]{", "{")
        return re.sub(r"(\[TOOL_CALLS\]\w+)\{", r"\1[ARGS]{", text)
    return text_after_the_calls(text, rng)


v11_mutate = mistral_mutator(["}", '"', "[ARGS]", "[TOOL_CALLS]"], r"\[ARGS\]|[{,:]", v11_own)


def arguments_after(text: str) -> list[str]:
    """Each call's text after its name (and ``[ARGS]``), as vLLM cuts it."""
    parts = text.split("[TOOL_CALLS]")[1:]
    return [re.split(r"\[ARGS\]|(?=\{)", part, maxsplit=1)[-1] for part in parts]


def trailing(text: str) -> bool:
    """A call's arguments followed by more than whitespace (before the next marker)."""
    for rest in arguments_after(text):
        try:
            end = json.JSONDecoder().raw_decode(rest.lstrip())[1]
        except ValueError:
            continue
        if rest.lstrip()[end:].strip():
            return True
    return False


def cut_before_arguments(text: str) -> bool:
    """The output ends inside a call's name: no ``[ARGS]`` or ``{`` after its last marker."""
    last = text.rpartition("[TOOL_CALLS]")[2]
    return "[ARGS]" not in last and "{" not in last


def not_an_object(calls: list[Call]) -> bool:
    for _, arguments in calls:
        try:
            if not isinstance(json.loads(arguments), dict):
                return True
        except ValueError:
            return True
    return False


V11_DIFFERENCES = (
    Difference(
        "call_id_in_the_name",
        "vLLM 0.32's v11 mode has no [CALL_ID] terminal: a call as mistral-common's v11 encoder "
        "and Small 3.2's template write it is named 'NAME[CALL_ID]ID' there; titoflow reads the "
        "name and the id (rendered back into history)",
        lambda text, calls: any("[CALL_ID]" in name for name, _ in calls),
        refusal=False,
    ),
    Difference(
        "text_after_the_arguments",
        "the calls run to the end of the output (mistral-common's format, the forced-call "
        "grammar): vLLM reads the first JSON value and drops what follows it; titoflow refuses "
        "rather than lose what the model wrote",
        lambda text, calls: trailing(text),
    ),
    Difference(
        "arguments_not_an_object",
        "vLLM passes arguments that are not a JSON object through (a string, cut-off JSON, "
        "none at all as {}); titoflow's calls carry the object the template renders back",
        lambda text, calls: not_an_object(calls) or text.rstrip().endswith("[ARGS]"),
    ),
    Difference(
        "cut_before_arguments",
        "the output ended inside a call's name (or right after a [TOOL_CALLS]): vLLM extracts "
        "the cut name with {} (and drops an empty last call, keeping the ones before); titoflow "
        "refuses the run with parse_error",
        lambda text, calls: cut_before_arguments(text),
    ),
    Difference(
        "bad_name",
        "vLLM extracts a call with an empty name or one holding whitespace or brackets (a v7 "
        "JSON list becomes a call named '['); titoflow refuses a call it cannot name",
        lambda text, calls: any(not re.fullmatch(r"[^\s\[\]{}\"]+", name) for name, _ in calls),
    ),
)


FAMILY = Family(
    "mistral_v11",
    "mistral",
    None,  # no reasoning block (Magistral Small 2506's <think> is the magistral family's)
    MISTRAL_TOOLS,
    ("[TOOL_CALLS]",),
    V11_DIFFERENCES,
    V11_VLLM + V11_MALFORMED,
    mutants(v11_bases(), v11_mutate, 80),
)

# The outputs these models commonly write that are calls, without error.
READS = {
    "with_call_id": ["read_file"],
    "args_marker_no_id": ["read_file"],
    "content_then_two_calls": ["read_file", "get_current_weather"],
    "space_before_arguments": ["read_file"],
}

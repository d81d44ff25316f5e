"""Seed-OSS: its template as vendored, the stand-in vocabulary's markers, the thinking budget
and the history the template writes, the parser on the shapes Seed-OSS writes (Python literals
in object arguments included), and the forced-call grammar as xgrammar compiles it on the
family's vocabulary (as vLLM does). Parity with vLLM's parsers and the corpus proof are in
test_parser_parity.py and test_family_corpus.py."""

from __future__ import annotations

import json

import pytest

from cli.dev.tokenizers.seed_oss import BOS, EOS, MARKERS, PAD, TEMPLATE
from tests.support.family_checks import (
    LIST_DIR_WITH_PARAMETERS,
    USER,
    FamilyUnderTest,
    assert_left_as_text,
    read_calls,
    run_tool,
)
from tests.support.family_checks import tool_call as call
from titoflow.tito.families.seed_oss import SEED_OSS
from titoflow.tito.messages import Message

# ggml-org/llama.cpp models/templates/ByteDance-Seed-OSS.jinja @b1933d3, as vendored.
TEMPLATE_SHA256 = "39a23a1a28f68acd747373fa688bea630021ec4db2bc8dec2fd3962240fb0418"
TOOLS = [
    run_tool(
        {
            "command": {"type": "string"},
            "timeout": {"type": "integer"},
            "env": {"type": "object"},
            "args": {"type": "array"},
            "dry": {"type": "boolean"},
        }
    ),
    LIST_DIR_WITH_PARAMETERS,
]
UNDER_TEST = FamilyUnderTest("seed_oss", SEED_OSS, TOOLS)
render, parse = UNDER_TEST.render, UNDER_TEST.parse


def generated(messages: list[Message]) -> str:
    """What the model wrote for the last (assistant) message after its generation prompt, as
    the template writes it, up to its end token."""
    prompt = render(messages[:-1], add_generation_prompt=True)
    full = render(messages)
    assert full.startswith(prompt)
    return full[len(prompt) :].split(EOS)[0]


def test_the_template_is_the_vendored_file_and_detected() -> None:
    UNDER_TEST.vendored_template(TEMPLATE, TEMPLATE_SHA256)


def test_markers_are_single_tokens_and_the_directory_says_stand_in() -> None:
    UNDER_TEST.assert_single_tokens((BOS, EOS, PAD, *MARKERS))
    kept = "<seed:think>r</seed:think><seed:tool_call>x</seed:tool_call>"
    UNDER_TEST.assert_kept_by_a_skipping_decode(kept, EOS)
    assert "Qwen3 vocabulary" in (UNDER_TEST.stand_in() or "")


def test_the_generation_prompt_leaves_reasoning_to_the_model_and_the_budget_is_a_system_turn() -> (
    None
):
    prompt = render([USER], add_generation_prompt=True)
    assert prompt.endswith("<seed:bos>user\ngo<seed:eos><seed:bos>assistant\n")
    assert not SEED_OSS.reasoning_open(prompt)
    budget = render([USER], add_generation_prompt=True, thinking_budget=512)
    assert "thinking budget, which is 512" in budget and "every 128 tokens" in budget
    # A budget of 0 opens the reasoning with a budget note: the one prompt that leaves the model
    # inside <seed:think> (not read as open: see docs/models.md, Seed-OSS).
    none = render([USER], add_generation_prompt=True, thinking_budget=0)
    assert none.endswith("<seed:bos>assistant\n<seed:think><seed:cot_budget_reflect>")


def test_history_keeps_reasoning_trimmed() -> None:
    turn = Message(
        role="assistant",
        reasoning="\n Look first. \n",
        content=" Sure. ",
        tool_calls=(call({"command": "ls"}),),
    )
    result = Message(role="tool", tool_call_id="call_0", content="a.py")
    answer = Message(role="assistant", reasoning="Done.", content="It is a.py.")
    loop = render([USER, turn, result, USER, answer])
    assert "<seed:think>Look first.</seed:think>\nSure.\n\n<seed:tool_call>" in loop
    assert "<seed:think>Done.</seed:think>\nIt is a.py.<seed:eos>" in loop
    assert SEED_OSS.divergences == ("whitespace_trimmed",)


def test_the_parser_reads_what_the_template_writes_python_literals_included() -> None:
    arguments = {"command": "a\nb", "timeout": 5, "env": {"A": None}, "args": ["x"], "dry": True}
    turn = Message(
        role="assistant",
        reasoning="Plan.",
        content="Running.",
        tool_calls=(call(arguments), call({}, "list_dir", 1)),
    )
    text = generated([USER, turn])
    assert "<parameter=env>{'A': None}</parameter>" in text  # Jinja's string filter
    parsed = parse(text)
    assert parsed.parse_error is None
    assert (parsed.reasoning, parsed.content) == ("Plan.", "Running.")
    assert read_calls(parsed) == [("run", arguments), ("list_dir", {})]


@pytest.mark.parametrize(
    "value", ["['not', 'an', 'object']", "{(1, 2): 3}", "{'a': {1, 2}}", "{'a': 1e999}", "{[1]: 2}"]
)
def test_a_literal_of_another_type_or_not_json_stays_text(value: str) -> None:
    text = (
        "<seed:tool_call>\n<function=run>\n<parameter=command>ls</parameter>\n"
        f"<parameter=env>{value}</parameter>\n</function>\n</seed:tool_call>"
    )
    parsed = parse(text)
    assert parsed.parse_error is None
    assert json.loads(parsed.tool_calls[0].arguments)["env"] == value


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            "<seed:tool_call>\n<function=run>\n<parameter=command>ls\n</function>\n"
            "</seed:tool_call>",
            "parameter 'command' not closed",
        ),
        (
            "<seed:tool_call>\n<function=run>\n<parameter=command>a</parameter>\n"
            "<parameter=command>b</parameter>\n</function>\n</seed:tool_call>",
            "given twice",
        ),
        ("<seed:tool_call>hello</seed:tool_call>", "expected <function=NAME>"),
    ],
)
def test_malformed_calls_stay_text_and_are_reported(text: str, why: str) -> None:
    assert_left_as_text(parse("<seed:think>R</seed:think>\n" + text), text, why)


def test_a_call_opened_in_the_reasoning_ends_it_and_a_bare_function_is_a_call() -> None:
    block = "<function=list_dir>\n</function>"
    early = parse(f"<seed:think>Think.<seed:tool_call>\n{block}\n</seed:tool_call></seed:think>Ok.")
    assert (early.reasoning, early.content) == ("Think.", "Ok.")
    bare = parse(f"<seed:think>R</seed:think>\nSure.\n{block}\n</seed:tool_call>")
    assert bare.parse_error is None and bare.content == "Sure."
    assert [c.name for c in early.tool_calls] == [c.name for c in bare.tool_calls] == ["list_dir"]


def test_xgrammar_admits_what_the_template_writes_and_no_spelled_tag() -> None:
    """The template's rendering of a call with string and integer values, one or two, is
    admitted, then <seed:eos> ends the turn; a call to an undeclared tool or off its schema is
    not."""
    one = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 5}),))
    two = Message(role="assistant", tool_calls=(call({"command": "a b"}), call({}, "list_dir", 1)))
    written_one = generated([USER, one])
    assert written_one.startswith("<seed:tool_call>\n<function=run>")
    UNDER_TEST.assert_xgrammar_admits_the_template(
        EOS,
        written_one,
        generated([USER, two]),
        written_one.replace("=run>", "=rm>"),
        written_one.replace(">5<", ">five<"),
    )

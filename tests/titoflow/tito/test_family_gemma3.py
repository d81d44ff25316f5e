"""Gemma 3 (pythonic calls through vLLM's template): the template as vendored and detected
(Google's own, without tools, not), the stand-in vocabulary's markers, the history the template
writes (calls without commas between arguments, results in ``<tool_response>``, conversations it
refuses), and the parser on the shapes Gemma 3 writes. Parity with vLLM's ``pythonic`` parser
and the corpus proof are in test_parser_parity.py and test_family_corpus.py; the forced-call
grammar is Llama 4's, compiled by xgrammar in test_family_llama4.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli.dev.tokenizers.gemma3 import BOS, EOS, MARKERS, PAD, TEMPLATE
from tests.support.corpus import corpus
from tests.support.family_checks import (
    LIST_DIR,
    USER,
    FamilyUnderTest,
    assert_left_as_text,
    assert_only_calls,
    run_tool,
)
from tests.support.family_corpus import TEMPLATE_REFUSES, in_family_ids, renderer_of
from titoflow.errors import TemplateError
from titoflow.tito.families import detect_family
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.gemma3 import GEMMA3
from titoflow.tito.families.llama4 import LLAMA4
from titoflow.tito.messages import Message, ToolCall

# vllm-project/vllm examples/tool_chat_template_gemma3_pythonic.jinja @c6991a3, as vendored.
TEMPLATE_SHA256 = "659a5b7f8c93ba6364ddd81b0e0224b3c98987268bfe03f2c8a01a18c1087a15"
TOOLS = [run_tool(), LIST_DIR]
UNDER_TEST = FamilyUnderTest("gemma3", GEMMA3, TOOLS)
tokenizer, render, parse = UNDER_TEST.tokenizer, UNDER_TEST.render, UNDER_TEST.parse


def test_the_template_is_the_vendored_file_and_detected() -> None:
    text = UNDER_TEST.vendored_template(TEMPLATE, TEMPLATE_SHA256)
    # Google's own Gemma 3 template has the same turns and no tool format: without the
    # pythonic instruction nothing is detected (its tools would vanish from the prompt).
    with pytest.raises(ValueError, match="no known model family"):
        detect_family(text.replace("[func_name1(", "{"))


def test_the_stand_in_vocabulary_has_gemmas_markers_as_special_tokens() -> None:
    UNDER_TEST.assert_single_tokens((BOS, EOS, PAD, *MARKERS), special=True)
    assert UNDER_TEST.stand_in()


def test_the_generation_prompt_and_what_history_writes() -> None:
    system = Message(role="system", content="Be brief.")
    prompt = render([system, USER], add_generation_prompt=True)
    # The system prompt and the tool list open the first user turn; Gemma has no system role.
    assert prompt.startswith("<bos><start_of_turn>user\nBe brief.\n\nTools (functions) are")
    assert prompt.endswith('"List"\n        }\n    }\n]\n\ngo<end_of_turn>\n<start_of_turn>model\n')
    calls = (
        ToolCall(id="c0", name="run", arguments=json.dumps({"command": "ls", "timeout": 3})),
        ToolCall(id="c1", name="list_dir", arguments="{}"),
    )
    turn = Message(role="assistant", content="", tool_calls=calls)
    result = Message(role="tool", tool_call_id="c0", content=" a.py\n")
    loop = render([USER, turn, result], add_generation_prompt=True)
    # Values as JSON, but no comma between arguments (the template's loop-scoped flag): the
    # re-rendered call is not the one sampled, and not valid Python.
    written = '[run(command="ls"timeout=3), list_dir()]'
    assert "<start_of_turn>model\n" + written + "<end_of_turn>\n" in loop
    assert "<start_of_turn>user\n<tool_response>\na.py</tool_response><end_of_turn>\n" in loop
    assert parse(written).parse_error is not None
    assert "call_arguments_rewritten" in GEMMA3.divergences


def test_the_template_refuses_a_user_message_right_after_tool_results() -> None:
    """Why the corpus proof leaves out the conversations in TEMPLATE_REFUSES for this family."""
    refused = [name for family, name in TEMPLATE_REFUSES if family == "gemma3"]
    renderer = renderer_of("gemma3")
    for conversation in corpus():
        messages = in_family_ids(GEMMA3, conversation).messages
        if conversation.name in refused:
            with pytest.raises(TemplateError, match="must alternate"):
                renderer.full_prompt(messages, conversation.tools, {})
        else:
            assert renderer.full_prompt(messages, conversation.tools, {})


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('[run(command="ls", timeout=30)]', [("run", {"command": "ls", "timeout": 30})]),
        ('[run(command="ls"), list_dir()]', [("run", {"command": "ls"}), ("list_dir", {})]),
        ('[run(command="a", timeout=null)]\n', [("run", {"command": "a", "timeout": None})]),
    ],
)
def test_call_lists_are_read(text: str, calls: list[tuple[str, Any]]) -> None:
    assert_only_calls(parse(text), calls)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[run(command="ls"timeout=30)]', "invalid Python"),
        ('[run("ls")]', "positional arguments"),
        ('I will. [run(command="ls")]', "a call list inside text"),
        ('```tool_code\n[run(command="ls")]\n```', "a call list inside text"),
    ],
)
def test_malformed_call_lists_stay_text_and_are_reported(text: str, why: str) -> None:
    assert_left_as_text(parse(text), text, why)


def test_a_python_tag_is_not_gemmas() -> None:
    """Llama 4's ``<|python_start|>`` opens a call there, none here: Gemma has no such tag."""
    text = '<|python_start|>[run(command="ls")]<|python_end|>'
    llama4 = LLAMA4.parser(ParserOptions("step", tools=TOOLS))
    llama4.feed(text)
    assert [c.name for c in llama4.finish()[1].tool_calls] == ["run"]
    parsed = parse(text)
    assert parsed.tool_calls == [] and parsed.parse_error is not None

"""Nemotron Nano v2: its template as vendored, the stand-in vocabulary's markers, the /think and
/no_think switches and the history the template writes, the parser on the shapes the model
writes (a call list, malformed lists refused with parse_error, a call opened in the reasoning
ending it), and the forced-call grammar as xgrammar compiles it on the family's vocabulary
(as vLLM does). The corpus proof is in test_family_corpus.py; vLLM 0.32 has no parser for
``<TOOLCALL>`` to hold this one to (see docs/models.md, Nemotron Nano v2)."""

from __future__ import annotations

import pytest

from cli.dev.tokenizers.nemotron_nano_v2 import EOS, MARKERS, SYSTEM, TEMPLATE, TURN
from tests.support.family_checks import (
    LIST_DIR_WITH_PARAMETERS,
    USER,
    FamilyUnderTest,
    assert_left_as_text,
    read_calls,
    run_tool,
)
from tests.support.family_checks import tool_call as call
from titoflow.tito.families.nemotron_nano_v2 import NEMOTRON_NANO_V2
from titoflow.tito.messages import Message

# ggml-org/llama.cpp models/templates/NVIDIA-Nemotron-Nano-v2.jinja @f01caef, as vendored.
TEMPLATE_SHA256 = "b9e2e5be2f6f3f8e1fc0d5ba2a35c785cd90df65888e65149ce3efbe213b146a"
TOOLS = [run_tool(), LIST_DIR_WITH_PARAMETERS]
LATER = Message(role="user", content="and then?")


UNDER_TEST = FamilyUnderTest("nemotron_nano_v2", NEMOTRON_NANO_V2, TOOLS, reasoning_open=True)
tokenizer, render, parse = UNDER_TEST.tokenizer, UNDER_TEST.render, UNDER_TEST.parse


def written(turn: Message) -> str:
    """What the template writes of ``turn`` in history (it writes a final assistant message as
    a prefill, so a user turn follows it), from its opening up to its end token."""
    full = render([USER, turn, LATER])
    opening = TURN + "Assistant\n"
    return full[full.index(opening) + len(opening) : full.index(EOS)]


def test_the_template_is_the_vendored_file_and_detected() -> None:
    UNDER_TEST.vendored_template(TEMPLATE, TEMPLATE_SHA256)


def test_markers_are_single_tokens_and_the_directory_says_stand_in() -> None:
    UNDER_TEST.assert_single_tokens((SYSTEM, TURN, EOS, *MARKERS))
    UNDER_TEST.assert_kept_by_a_skipping_decode("<think>r</think><TOOLCALL>[]</TOOLCALL>", EOS)
    assert "tekken vocabulary" in (UNDER_TEST.stand_in() or "")


def test_think_and_no_think_switch_the_opened_reasoning() -> None:
    thinking = render([USER], add_generation_prompt=True)
    assert thinking.endswith(f"{TURN}User\ngo\n{TURN}Assistant\n<think>\n\n")
    assert NEMOTRON_NANO_V2.reasoning_open(thinking)
    system = Message(role="system", content="Be brief. /no_think")
    off = render([system, USER], add_generation_prompt=True)
    assert off.startswith(f"{SYSTEM}System\nBe brief.\n\n")  # the flag is not written
    assert off.endswith(f"{TURN}Assistant\n<think></think>")
    assert not NEMOTRON_NANO_V2.reasoning_open(off)


def test_history_drops_reasoning_and_trims_content() -> None:
    turn = Message(
        role="assistant",
        reasoning="Look first.",
        content=" Sure. ",
        tool_calls=(call({"command": "ls"}),),
    )
    calls = '<TOOLCALL>[{"name": "run", "arguments": {"command": "ls"}}]</TOOLCALL>'
    assert written(turn) == f"Sure.\n\n{calls}\n"
    # A reasoning block written into the content is cut off too.
    inline = turn.model_copy(update={"reasoning": None, "content": "<think>Look.</think> Sure."})
    assert written(inline) == f"Sure.\n\n{calls}\n"
    assert NEMOTRON_NANO_V2.divergences == ("reasoning_dropped", "whitespace_trimmed")


def test_the_parser_reads_what_the_template_writes() -> None:
    arguments = {"command": "a\nb", "timeout": 5}
    turn = Message(
        role="assistant", content="Running.", tool_calls=(call(arguments), call({}, "list_dir", 1))
    )
    text = "Plan.\n</think>\n\n" + written(turn).strip()
    parsed = parse(text)
    assert parsed.parse_error is None
    assert (parsed.reasoning, parsed.content) == ("Plan.", "Running.")
    assert read_calls(parsed) == [("run", arguments), ("list_dir", {})]
    # /no_think: the prompt closed the block; the model writes content and calls only.
    plain = parse(written(turn).strip(), reasoning_open=False)
    assert plain.parse_error is None and plain.reasoning is None
    assert [c.name for c in plain.tool_calls] == ["run", "list_dir"]


@pytest.mark.parametrize(
    ("call_text", "why"),
    [
        ('<TOOLCALL>[{"name": "run", "arguments": {"command": "ls"}</TOOLCALL>', "invalid JSON"),
        ('<TOOLCALL>[{"name": "run", "arguments": "ls"}]</TOOLCALL>', "not an object"),
        ("<TOOLCALL>[]</TOOLCALL>", "not a non-empty JSON list"),
        ('<TOOLCALL>[{"arguments": {}}]</TOOLCALL>', 'missing or non-string "name"'),
        ('<TOOLCALL>[{"name": "run", "arguments": {}}] and more</TOOLCALL>', "text after"),
    ],
)
def test_malformed_calls_stay_text_and_are_reported(call_text: str, why: str) -> None:
    assert_left_as_text(parse("R</think>\n\n" + call_text), call_text, why)


def test_an_unclosed_list_is_read_and_a_call_opened_in_the_reasoning_ends_it() -> None:
    cut = parse('R</think>\n\n<TOOLCALL>[{"name": "list_dir", "arguments": {}}]')
    assert cut.parse_error is None and [c.name for c in cut.tool_calls] == ["list_dir"]
    block = '<TOOLCALL>[{"name": "list_dir", "arguments": {}}]</TOOLCALL>'
    early = parse(f"Think.{block}</think>\n\nOk.")
    assert (early.reasoning, early.content) == ("Think.", "Ok.")
    # A forced call: the output starts with the call, inside the <think> the prompt opened.
    forced = parse(block)
    assert not forced.reasoning and forced.parse_error is None
    assert [c.name for c in early.tool_calls] == [c.name for c in forced.tool_calls] == ["list_dir"]


def test_xgrammar_admits_what_the_template_writes_and_no_spelled_tag() -> None:
    """The template's rendering of a call list, one call or two, is admitted, then <SPECIAL_12>
    ends the turn; a call to an undeclared tool or off its schema is not."""
    one = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 5}),))
    two = Message(role="assistant", tool_calls=(call({"command": "a b"}), call({}, "list_dir", 1)))
    written_one = written(one).strip()
    assert written_one.startswith('<TOOLCALL>[{"name": "run"')
    UNDER_TEST.assert_xgrammar_admits_the_template(
        EOS,
        written_one,
        written(two).strip(),
        written_one.replace('"run"', '"rm"'),
        written_one.replace(": 5", ': "five"'),
    )

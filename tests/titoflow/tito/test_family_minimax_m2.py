"""MiniMax-M2: its template as vendored, the stand-in vocabulary's markers, the history the
template keeps, the parser on the shapes MiniMax-M2 writes, and the forced-call grammar as
xgrammar compiles it on the family's vocabulary (as vLLM does). Parity with vLLM's parsers and
the corpus proof are in test_parser_parity.py and test_family_corpus.py."""

from __future__ import annotations

import json

import pytest

from cli.dev.tokenizers.minimax_m2 import CALL_MARKERS, SPECIALS, TEMPLATE
from tests.support.families import CALL_TOOLS
from tests.support.family_checks import USER, FamilyUnderTest, assert_left_as_text, read_calls
from tests.support.family_checks import tool_call as call
from tests.support.xgrammar_check import admitted
from titoflow.tito.families.minimax_m2 import MINIMAX_M2
from titoflow.tito.messages import Message
from titoflow.tito.tokenizer import TextEncoder

# ggml-org/llama.cpp models/templates/unsloth-MiniMax-M2.jinja @a21f05a, as vendored.
TEMPLATE_SHA256 = "44ec5484bf60ce519b422889550eb7c52c6a27e00ca3a688b8cb8b489d621410"
EMPTY = "\n</think>\n\n"  # an empty reasoning block's end, as the template writes one


UNDER_TEST = FamilyUnderTest("minimax_m2", MINIMAX_M2, CALL_TOOLS, reasoning_open=True)
tokenizer, render, parse = UNDER_TEST.tokenizer, UNDER_TEST.render, UNDER_TEST.parse
constraint = UNDER_TEST.constraint


def generated(messages: list[Message]) -> str:
    """What the model wrote for the last (assistant) message after its generation prompt, as
    the template writes it, up to its end token: a turn without reasoning closes the block the
    prompt opened, empty as the template writes one."""
    prompt = render(messages[:-1], add_generation_prompt=True)
    full = render(messages)
    head = prompt.removesuffix("<think>\n")
    assert full.startswith(head)
    written = full[len(prompt) :] if full.startswith(prompt) else EMPTY + full[len(head) :]
    return written.split("[e~[")[0]


def test_the_template_is_the_vendored_file_and_detected() -> None:
    UNDER_TEST.vendored_template(TEMPLATE, TEMPLATE_SHA256)


def test_markers_are_single_tokens_and_the_directory_says_stand_in() -> None:
    UNDER_TEST.assert_single_tokens((*SPECIALS, *CALL_MARKERS, "<think>", "</think>"))
    # The call markers survive a decode that skips special tokens (the parser reads them).
    ids = TextEncoder(tokenizer())("<minimax:tool_call>x</minimax:tool_call>[e~[")
    assert tokenizer().decode(ids, skip_special_tokens=True) == (
        "<minimax:tool_call>x</minimax:tool_call>"
    )
    assert "Qwen3 vocabulary" in (UNDER_TEST.stand_in() or "")


def test_the_generation_prompt_opens_reasoning() -> None:
    prompt = render([USER], add_generation_prompt=True)
    assert prompt.endswith("[e~[\n]~b]user\ngo[e~[\n]~b]ai\n<think>\n")
    assert MINIMAX_M2.reasoning_open(prompt[-20:])


def test_history_keeps_reasoning_only_after_the_last_user_message() -> None:
    turn = Message(role="assistant", reasoning="Look first.", tool_calls=(call({"command": "ls"}),))
    result = Message(role="tool", tool_call_id="call_0", content="a.py")
    loop = render([USER, turn, result])
    assert "<think>\nLook first.\n</think>\n\n" in loop  # kept inside the tool loop
    later = render([USER, turn, result, Message(role="assistant", content="ok"), USER])
    assert "Look first." not in later  # dropped once a user message follows


def test_arguments_are_written_raw_or_as_json_and_read_back_typed() -> None:
    arguments = {"command": "ls -la\ncat x", "timeout": 30, "env": {"A": "1"}, "dry": False}
    turn = Message(role="assistant", reasoning="R", content="Sure.", tool_calls=(call(arguments),))
    text = generated([USER, turn])
    assert text == (
        'R\n</think>\n\nSure.\n<minimax:tool_call>\n<invoke name="run">\n'
        '<parameter name="command">ls -la\ncat x</parameter>\n'
        '<parameter name="timeout">30</parameter>\n'
        '<parameter name="env">{"A": "1"}</parameter>\n'
        '<parameter name="dry">false</parameter>\n</invoke>\n</minimax:tool_call>\n'
    )
    parsed = parse(text)
    assert parsed.parse_error is None
    assert (parsed.reasoning, parsed.content) == ("R", "Sure.")
    assert read_calls(parsed) == [("run", arguments)]


def test_a_string_parameter_stays_text_and_a_bad_typed_value_is_kept_as_written() -> None:
    text = (
        '<minimax:tool_call><invoke name="run"><parameter name="command">30</parameter>'
        '<parameter name="timeout">soon</parameter></invoke></minimax:tool_call>'
    )
    parsed = parse(text)
    assert json.loads(parsed.tool_calls[0].arguments) == {"command": "30", "timeout": "soon"}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            '<minimax:tool_call><invoke name="run"><parameter name="command">ls</invoke>'
            "</minimax:tool_call>",
            "parameter 'command' not closed",
        ),
        (
            '<minimax:tool_call><invoke name="run"><parameter name="command">a</parameter>'
            '<parameter name="command">b</parameter></invoke></minimax:tool_call>',
            "given twice",
        ),
        ("<minimax:tool_call>hello</minimax:tool_call>", "expected <invoke"),
        ("<minimax:tool_call></minimax:tool_call>", "empty"),
    ],
)
def test_malformed_calls_stay_text_and_are_reported(text: str, why: str) -> None:
    assert_left_as_text(parse("R</think>" + text), text, why)


def test_a_call_opened_in_the_reasoning_ends_it_and_a_bare_invoke_is_a_call() -> None:
    text = '<invoke name="list_dir"></invoke>'
    early = parse("Think.<minimax:tool_call>" + text + "</minimax:tool_call></think>Done.")
    assert (early.reasoning, early.content) == ("Think.", "Done.")
    bare = parse("R</think>\n\nSure.\n" + text + "\n</minimax:tool_call>")
    assert bare.parse_error is None and bare.content == "Sure."
    assert [c.name for c in early.tool_calls] == [c.name for c in bare.tool_calls] == ["list_dir"]


def test_xgrammar_admits_what_the_template_writes_and_no_spelled_tag() -> None:
    """Compiled by xgrammar on the family's vocabulary, as vLLM compiles it: the template's
    rendering of a call (the forced output starts with it, the prompt having opened <think>)
    is admitted, then [e~[ ends the turn; a section marker spelled in pieces is not, nor the
    newline the vendored template writes before [e~[."""
    one = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 5}),))
    two = Message(
        role="assistant",
        tool_calls=(call({"command": "a b"}), call({}, "list_dir", 1)),
    )

    def written(turn: Message) -> str:
        return generated([USER, turn]).removeprefix(EMPTY).strip("\n")

    assert constraint("named").count('"type":"token"') == 2  # both section markers by id
    cases = {
        "named": (constraint("named"), written(one)),
        "parallel": (constraint("required", parallel=True), written(two)),
        "spelled": (constraint("required"), "<minimax:tool_call" + written(one)[19:]),
        # As MiniMax's own file writes a turn's end, not as the vendored copy does (the
        # family's `call_end_spaced`): history renders a newline the model did not sample.
        "newline_before_end": (constraint("named"), written(one) + "\n"),
    }
    assert written(one).startswith("<minimax:tool_call>\n<invoke")
    result = admitted("minimax_m2", "[e~[", cases)
    assert result == {
        "named": True,
        "parallel": True,
        "spelled": False,
        "newline_before_end": False,
    }
    assert "</minimax:tool_call>\n[e~[" in render([USER, one])
    assert "call_end_spaced" in MINIMAX_M2.divergences

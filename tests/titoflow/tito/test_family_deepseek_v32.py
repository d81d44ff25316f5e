"""DeepSeek-V3.2: its template as vendored and as served (its pinned edits), the directory (V3's
vocabulary, ``deepseek_v3``'s tokenizer file byte for byte), the thinking switch, the history the
template keeps, the parser on the DSML shapes V3.2 writes, and the forced-call grammar as xgrammar
compiles it on the family's vocabulary (as vLLM does). The template against DeepSeek's encoder is
test_template_deepseek_v32.py; parity with vLLM's parsers and the corpus proof are in
test_parser_parity.py and test_family_corpus.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from cli.dev.tokenizers import template_path, tokenizer_dir
from cli.dev.tokenizers.deepseek_v32 import EDITS, TEMPLATE, chat_template
from tests.support.families import CALL_TOOLS
from tests.support.family_checks import USER, FamilyUnderTest, assert_left_as_text, read_calls
from tests.support.family_checks import tool_call as call
from tests.support.xgrammar_check import admitted
from titoflow.tito.families import FAMILIES, detect_family
from titoflow.tito.families.deepseek_v32 import (
    CALLS_CLOSE,
    CALLS_OPEN,
    DEEPSEEK_V32,
    DSML,
    INVOKE_OPEN,
)
from titoflow.tito.messages import Message
from titoflow.tito.tokenizer import TextEncoder

# ggml-org/llama.cpp models/templates/DeepSeek-V3.2.jinja @708653d, as vendored.
TEMPLATE_SHA256 = "1739ce6e935aca276bcdda205be89698e91928a623ea681ca75ccb9d91f61be0"
EOS = "<｜end▁of▁sentence｜>"

UNDER_TEST = FamilyUnderTest("deepseek_v32", DEEPSEEK_V32, CALL_TOOLS)
tokenizer, token_id, render = UNDER_TEST.tokenizer, UNDER_TEST.token_id, UNDER_TEST.render
parse, constraint = UNDER_TEST.parse, UNDER_TEST.constraint


def written(turn: Message) -> str:
    """What the model writes for ``turn`` (the template writes no generation prompt: the user
    turn ends with the assistant's opening), up to its end token."""
    return UNDER_TEST.written_after_user(turn, EOS)


def test_the_template_is_the_vendored_file_with_its_pinned_edits() -> None:
    text = template_path(TEMPLATE).read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == TEMPLATE_SHA256
    served = tokenizer().chat_template
    assert served == chat_template() != text
    for _, old, new in EDITS:
        assert text.count(old) == 1 and (not new or served.count(new) == 1)
    assert detect_family(text) is detect_family(served) is DEEPSEEK_V32
    assert [f.name for f in FAMILIES if f.detect(served)] == ["deepseek_v32"]


def test_the_vendored_port_appends_an_empty_user_turn_the_served_one_does_not() -> None:
    port = tokenizer()
    dicts = [USER.template_dict()]
    verbatim = port.apply_chat_template(
        dicts,
        chat_template=template_path(TEMPLATE).read_text(),
        add_generation_prompt=True,
        tokenize=False,
    )
    assert verbatim.endswith("<｜User｜>go<｜Assistant｜><think><｜User｜>\n<｜Assistant｜><think>")
    assert render([USER], add_generation_prompt=True) == render([USER])
    assert render([USER], add_generation_prompt=True).endswith(
        "<｜User｜>go<｜Assistant｜></think>"
    )


def test_the_directory_is_deepseek_v3s_vocabulary_and_dsml_is_text() -> None:
    ours, v3 = tokenizer_dir("deepseek_v32"), tokenizer_dir("deepseek_v3")
    assert (ours / "tokenizer.json").read_bytes() == (v3 / "tokenizer.json").read_bytes()
    assert UNDER_TEST.stand_in() == ""
    for marker in (DSML, CALLS_OPEN, CALLS_CLOSE, INVOKE_OPEN):
        assert token_id(marker) is None, marker  # plain text, several tokens
    for marker in ("<think>", "</think>", "<｜User｜>", "<｜Assistant｜>", EOS):
        assert token_id(marker) is not None, marker
    # The markers survive a decode that skips special tokens (they are text).
    ids = TextEncoder(tokenizer())(f"{CALLS_OPEN}x{CALLS_CLOSE}{EOS}")
    assert tokenizer().decode(ids, skip_special_tokens=True) == f"{CALLS_OPEN}x{CALLS_CLOSE}"


def test_the_thinking_switch_ends_the_user_turn() -> None:
    assert render([USER]).endswith("<｜Assistant｜></think>")  # chat mode by default, as vLLM
    thinking = render([USER], enable_thinking=True)
    assert thinking.endswith("<｜Assistant｜><think>")
    assert DEEPSEEK_V32.reasoning_open(thinking[-20:])
    assert not DEEPSEEK_V32.reasoning_open(render([USER])[-20:])


def test_history_keeps_reasoning_only_after_the_last_user_message() -> None:
    turn = Message(role="assistant", reasoning="Look first.", tool_calls=(call({"command": "ls"}),))
    result = Message(role="tool", tool_call_id="call_0", content="a.py")
    loop = render([USER, turn, result], enable_thinking=True)
    assert "<think>Look first.</think>\n\n<｜DSML｜function_calls>" in loop
    assert loop.endswith("<result>a.py</result>\n</function_results>\n\n<think>")
    answer = Message(role="assistant", reasoning="Fine.", content="ok")
    later = render([USER, turn, result, answer, USER], enable_thinking=True)
    assert "Look first." not in later and "Fine." not in later
    # The first user turn's <think> became </think> (thinking_opener_moved).
    assert later.count("<think>") == 2  # the tool instructions' example and the last user turn
    assert "Look first." not in render([USER, turn, result])  # chat mode writes none


def test_arguments_are_written_raw_or_as_json_and_read_back_typed() -> None:
    arguments = {"command": "ls -la\ncat x", "timeout": 30, "env": {"A": "1"}, "dry": False}
    turn = Message(role="assistant", content="Sure.", tool_calls=(call(arguments),))
    text = written(turn)
    assert f'{DSML}parameter name="command" string="true">ls -la\ncat x</{DSML}parameter>' in text
    assert f'{DSML}parameter name="env" string="false">{{"A": "1"}}</{DSML}parameter>' in text
    parsed = parse(text)
    assert parsed.parse_error is None and parsed.content == "Sure."
    assert read_calls(parsed) == [("run", arguments)]


def test_the_string_attribute_types_the_value_not_the_schema() -> None:
    text = (
        f'{CALLS_OPEN}\n{INVOKE_OPEN}"run">\n'
        f'<{DSML}parameter name="command" string="true">42</{DSML}parameter>\n'
        f'<{DSML}parameter name="timeout" string="false">"30"</{DSML}parameter>\n'
        f"</{DSML}invoke>\n{CALLS_CLOSE}"
    )
    parsed = parse(text)
    assert json.loads(parsed.tool_calls[0].arguments) == {"command": "42", "timeout": "30"}


def dsml(parameters: str, name: str = "run") -> str:
    return f'{CALLS_OPEN}\n{INVOKE_OPEN}"{name}">\n{parameters}\n</{DSML}invoke>\n{CALLS_CLOSE}'


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (dsml(f'<{DSML}parameter name="timeout" string="false">soon</{DSML}parameter>'), "JSON"),
        (dsml(f'<{DSML}parameter name="timeout">30</{DSML}parameter>'), "string=None"),
        (
            dsml(
                f'<{DSML}parameter name="command" string="true">a</{DSML}parameter>\n'
                f'<{DSML}parameter name="command" string="true">b</{DSML}parameter>'
            ),
            "given twice",
        ),
        (dsml(f'<{DSML}parameter name="command" string="true">ls'), "not closed"),
        (dsml(f'x<{DSML}parameter name="command" string="true">ls</{DSML}parameter>'), "text"),
        (f"{CALLS_OPEN}\n{CALLS_CLOSE}", "empty"),
        (f'{CALLS_OPEN}\n{INVOKE_OPEN}"run"\n{CALLS_CLOSE}', "expected"),
    ],
)
def test_malformed_calls_stay_text_and_are_reported(text: str, why: str) -> None:
    assert_left_as_text(parse("Hm. " + text), "Hm. " + text, why)


def test_a_skipped_parameter_closer_and_a_cut_block_are_read_as_vllm_reads_them() -> None:
    skipped = dsml(
        f'<{DSML}parameter name="command" string="true">ls\n'
        f'<{DSML}parameter name="timeout" string="false">3</{DSML}parameter>'
    )
    assert json.loads(parse(skipped).tool_calls[0].arguments) == {"command": "ls\n", "timeout": 3}
    cut = f'{CALLS_OPEN}\n{INVOKE_OPEN}"list_dir">\n</{DSML}invoke>'
    assert [c.name for c in parse(cut).tool_calls] == ["list_dir"]
    bare = parse(f'Sure.\n{INVOKE_OPEN}"list_dir">\n</{DSML}invoke>')
    assert bare.parse_error is None and bare.content == "Sure."
    assert [c.name for c in bare.tool_calls] == ["list_dir"]


def test_a_block_inside_the_reasoning_is_reasoning() -> None:
    block = dsml("", "list_dir")
    parsed = parse(f"Maybe {block}</think>Done.", reasoning_open=True)
    assert parsed.tool_calls == [] and parsed.content == "Done."
    assert parsed.reasoning == f"Maybe {block}"


def test_xgrammar_admits_what_the_template_writes_and_refuses_the_rest() -> None:
    """Compiled by xgrammar on the family's vocabulary, as vLLM compiles it: the template's
    rendering of a call turn (chat mode: the forced output starts the turn) is admitted, then
    the end of sentence ends it; an undeclared tool, a mistyped argument and a value with the
    wrong ``string`` attribute are not."""
    one = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 5}),))
    two = Message(role="assistant", tool_calls=(call({"command": "a b"}), call({}, "list_dir", 1)))
    wrong_tool = written(one).replace('"run"', '"rm"')
    mistyped = written(one).replace(">5<", ">five<")
    unstrung = written(one).replace('string="false">5', 'string="true">5')
    cases = {
        "named": (constraint("named"), written(one)),
        "parallel": (constraint("required", parallel=True), written(two)),
        "undeclared": (constraint("required"), wrong_tool),
        "mistyped": (constraint("required"), mistyped),
        "unstrung": (constraint("required"), unstrung),
    }
    assert written(one).startswith(f"\n\n{CALLS_OPEN}\n{INVOKE_OPEN}")
    # vLLM serves V3.2 (DeepseekV32ForCausalLM) in its deepseek_v32 tokenizer mode, which reads
    # tokenizer.json as written (its default mode would build the Llama class the config names).
    assert admitted("deepseek_v32", EOS, cases, tokenizer_mode="deepseek_v32") == {
        "named": True,
        "parallel": True,
        "undeclared": False,
        "mistyped": False,
        "unstrung": False,
    }

"""Nemotron Nano v2: its template as vendored, the stand-in vocabulary's markers, the /think and
/no_think switches and the history the template writes, the parser on the shapes the model
writes (a call list, malformed lists refused with parse_error, a call opened in the reasoning
ending it), and the forced-call grammar as xgrammar compiles it on the family's vocabulary
(as vLLM does). The corpus proof is in test_family_corpus.py; vLLM 0.32 has no parser for
``<TOOLCALL>`` to hold this one to (see docs/models.md, Nemotron Nano v2)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from cli.dev.tokenizers import STAMP, template_path, tokenizer_dir
from cli.dev.tokenizers.nemotron_nano_v2 import EOS, MARKERS, SYSTEM, TEMPLATE, TURN
from tests.support.families import family_token_id, family_tokenizer
from tests.titoflow.tito.xgrammar_check import admitted, structural_tag
from titoflow.tito.families import detect_family, grammar
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.nemotron_nano_v2 import NEMOTRON_NANO_V2
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput
from titoflow.tito.tokenizer import TextEncoder

# ggml-org/llama.cpp models/templates/NVIDIA-Nemotron-Nano-v2.jinja @f01caef, as vendored.
TEMPLATE_SHA256 = "b9e2e5be2f6f3f8e1fc0d5ba2a35c785cd90df65888e65149ce3efbe213b146a"
RUN = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}
LIST_DIR = {
    "type": "function",
    "function": {"name": "list_dir", "description": "List", "parameters": {"properties": {}}},
}
TOOLS = [RUN, LIST_DIR]
USER = Message(role="user", content="go")
LATER = Message(role="user", content="and then?")


def tokenizer() -> Any:
    return family_tokenizer("nemotron_nano_v2")


token_id = family_token_id("nemotron_nano_v2")


def render(messages: list[Message], **kwargs: Any) -> str:
    dicts = [m.template_dict() for m in messages]
    return str(tokenizer().apply_chat_template(dicts, tools=TOOLS, tokenize=False, **kwargs))


def call(arguments: dict[str, Any], name: str = "run", index: int = 0) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))


def parse(text: str, reasoning_open: bool = True) -> ParsedOutput:
    options = ParserOptions("step", tools=TOOLS, reasoning_open=reasoning_open)
    parser = NEMOTRON_NANO_V2.parser(options)
    parser.feed(text)
    return parser.finish()[1]


def written(turn: Message) -> str:
    """What the template writes of ``turn`` in history (it writes a final assistant message as
    a prefill, so a user turn follows it), from its opening up to its end token."""
    full = render([USER, turn, LATER])
    opening = TURN + "Assistant\n"
    return full[full.index(opening) + len(opening) : full.index(EOS)]


def test_the_template_is_the_vendored_file_and_detected() -> None:
    text = template_path(TEMPLATE).read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == TEMPLATE_SHA256
    assert tokenizer().chat_template == text
    assert detect_family(text) is NEMOTRON_NANO_V2


def test_markers_are_single_tokens_and_the_directory_says_stand_in() -> None:
    for marker in (SYSTEM, TURN, EOS, *MARKERS):
        assert token_id(marker) is not None, marker
    assert tokenizer().eos_token == EOS
    # The reasoning and call markers survive a decode that skips special tokens.
    ids = TextEncoder(tokenizer())("<think>r</think><TOOLCALL>[]</TOOLCALL>")
    kept = tokenizer().decode([*ids, token_id(EOS)], skip_special_tokens=True)
    assert kept == "<think>r</think><TOOLCALL>[]</TOOLCALL>"
    stamp = json.loads((tokenizer_dir("nemotron_nano_v2") / STAMP).read_text())
    assert "tekken vocabulary" in stamp["stand_in"]


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
    found = [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
    assert found == [("run", arguments), ("list_dir", {})]
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
    parsed = parse("R</think>\n\n" + call_text)
    assert parsed.tool_calls == [] and parsed.content == call_text
    assert parsed.parse_error is not None and why in parsed.parse_error


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


def constraint(choice: grammar.ToolChoice, **options: Any) -> str:
    return structural_tag(NEMOTRON_NANO_V2, TOOLS, choice, token_id, **options)


def test_xgrammar_admits_what_the_template_writes_and_no_spelled_tag() -> None:
    """Compiled by xgrammar on the family's vocabulary, as vLLM compiles it: the template's
    rendering of a call list, one call or two, is admitted, then <SPECIAL_12> ends the turn; a
    call to an undeclared tool or off its schema is not."""
    one = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 5}),))
    two = Message(role="assistant", tool_calls=(call({"command": "a b"}), call({}, "list_dir", 1)))
    written_one = written(one).strip()
    assert written_one.startswith('<TOOLCALL>[{"name": "run"')
    assert constraint("named").count('"type":"token"') == 2  # both call markers by id
    cases = {
        "named": (constraint("named"), written_one),
        "parallel": (constraint("required", parallel=True), written(two).strip()),
        "undeclared_tool": (constraint("required"), written_one.replace('"run"', '"rm"')),
        "text_for_integer": (constraint("named"), written_one.replace(": 5", ': "five"')),
    }
    result = admitted("nemotron_nano_v2", EOS, cases)
    assert result == {
        "named": True,
        "parallel": True,
        "undeclared_tool": False,
        "text_for_integer": False,
    }

"""Gemma 4 (native tool tokens, Google's template): the template as vendored and detected (and
every Gemma 4 revision TRL ships), the stand-in vocabulary (the ``gemma3`` directory's files with
Gemma 4's template), the reasoning switch, what history writes (results inside the calling model
turn, past reasoning dropped, text beside calls moved after the results), and the parser on
Gemma's argument syntax, and the forced-call grammar as xgrammar compiles it (the template's
calls admitted and ended by the stop token, nothing else). Parity with vLLM's ``gemma4``
parsers and the corpus proof are in test_parser_parity.py and test_family_corpus.py."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import pytest

from cli.dev.tokenizers import template_path, tokenizer_dir
from cli.dev.tokenizers.gemma3 import GEMMA4_MARKERS
from cli.dev.tokenizers.gemma4 import TEMPLATE
from tests.support.family_checks import (
    LIST_DIR,
    USER,
    FamilyUnderTest,
    assert_left_as_text,
    assert_only_calls,
    run_tool,
)
from tests.support.xgrammar_check import admitted
from titoflow.tito.families import detect_family, grammar
from titoflow.tito.families.gemma4 import GEMMA4, RESULTS
from titoflow.tito.messages import Message, ToolCall

# trl 1.16.0 trl/chat_templates/gemma4_v5.jinja (google/gemma-4-E2B-it @8995379), as vendored.
TEMPLATE_SHA256 = "0a2c8073c878ab1da004bee933a998606537bbb62016310352c7285c3f01c5b5"
# TRL's other Gemma 4 revisions (its README: google/gemma-4-E2B-it at earlier commits).
REVISIONS = ("gemma4.jinja", "gemma4_v2.jinja", "gemma4_v3.jinja", "gemma4_v4.jinja")
TOOLS = [run_tool(), LIST_DIR]
CALL = ToolCall(id="c0", name="run", arguments=json.dumps({"timeout": None, "command": "ls"}))
UNDER_TEST = FamilyUnderTest("gemma4", GEMMA4, TOOLS)
tokenizer, render, parse = UNDER_TEST.tokenizer, UNDER_TEST.render, UNDER_TEST.parse


def test_the_template_is_the_vendored_file_and_every_revision_is_detected() -> None:
    text = UNDER_TEST.vendored_template(TEMPLATE, TEMPLATE_SHA256)
    shipped = files("trl") / "chat_templates"
    assert (shipped / "gemma4_v5.jinja").read_text() == text
    for revision in REVISIONS:
        assert detect_family((shipped / revision).read_text()) is GEMMA4, revision
    # Gemma 3's templates have neither marker.
    assert detect_family(template_path("gemma3_pythonic.jinja").read_text()).name == "gemma3"


def test_the_stand_in_is_the_gemma3_directory_with_gemma4s_template() -> None:
    UNDER_TEST.assert_single_tokens(GEMMA4_MARKERS, special=True)
    own, gemma3 = tokenizer_dir("gemma4"), tokenizer_dir("gemma3")
    assert (own / "tokenizer.json").read_bytes() == (gemma3 / "tokenizer.json").read_bytes()
    assert UNDER_TEST.stand_in()


def test_the_reasoning_switch() -> None:
    assert render([USER], add_generation_prompt=True).endswith(
        "<|turn>user\ngo<turn|>\n<|turn>model\n"
    )
    on = render([USER], add_generation_prompt=True, enable_thinking=True)
    assert on.startswith("<bos><|turn>system\n<|think|>\n<|tool>") and on.endswith("<|turn>model\n")
    # After tool results the model's turn goes on; with thinking on the prompt opens a thought.
    turn = Message(role="assistant", content="", tool_calls=(CALL,))
    result = Message(role="tool", tool_call_id="c0", content="a.py")
    after = render([USER, turn, result], add_generation_prompt=True, enable_thinking=True)
    assert after.endswith("<tool_response|><|channel>thought\n")
    assert GEMMA4.reasoning_open(after[-40:])


def test_what_history_writes() -> None:
    turn = Message(role="assistant", content="", tool_calls=(CALL,), reasoning="hmm")
    result = Message(role="tool", tool_call_id="c0", content="a.py")
    answer = Message(role="assistant", content=" Done. ", reasoning="so")
    loop = render([USER, turn, result, answer])
    # Keys sorted, the result inside the calling turn, the reasoning of
    # turns after the last user message kept with a newline before <channel|>, content trimmed.
    assert loop.endswith(
        "<|turn>model\n<|channel>thought\nhmm\n<channel|>"
        '<|tool_call>call:run{command:<|"|>ls<|"|>,timeout:null}<tool_call|>'
        '<|tool_response>response:run{value:<|"|>a.py<|"|>}<tool_response|>'
        "<|channel>thought\nso\n<channel|>Done.<turn|>\n"
    )
    later = render([USER, turn, result, answer, USER])
    assert "hmm" not in later and "so" not in later and "reasoning_dropped" in GEMMA4.divergences
    # Text beside calls moves after the results, where the turn is closed.
    spoken = Message(role="assistant", content="Let me look.", tool_calls=(CALL,))
    moved = render([USER, spoken, result], add_generation_prompt=True)
    assert moved.endswith("<tool_response|>Let me look.<turn|>\n")
    assert not GEMMA4.content_with_calls


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        (
            '<|tool_call>call:run{command:<|"|>ls -la\n"x"<|"|>,timeout:30}<tool_call|>',
            [("run", {"command": 'ls -la\n"x"', "timeout": 30})],
        ),
        (
            '<|tool_call>call:run{command:<|"|>a<|"|>,timeout:None}<tool_call|>'
            "<|tool_call>call:list_dir{}<tool_call|>",
            [("run", {"command": "a", "timeout": None}), ("list_dir", {})],
        ),
        (
            '<|tool_call>call:run{o:{k:[1,2.5,true,<|"|>z<|"|>,{}]},n:-1e-05}<tool_call|>',
            [("run", {"o": {"k": [1, 2.5, True, "z", {}]}, "n": -1e-05})],
        ),
    ],
)
def test_calls_are_read(text: str, calls: list[tuple[str, Any]]) -> None:
    assert_only_calls(parse(text), calls)


def test_reasoning_then_a_call_and_a_call_that_ends_the_reasoning() -> None:
    parsed = parse("<|channel>thought\nfirst ls\n<channel|><|tool_call>call:list_dir{}<tool_call|>")
    assert parsed.reasoning == "first ls" and [c.name for c in parsed.tool_calls] == ["list_dir"]
    opened = parse("check\n<|tool_call>call:list_dir{}<tool_call|>", reasoning_open=True)
    assert opened.reasoning == "check" and [c.name for c in opened.tool_calls] == ["list_dir"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("<|tool_call>run{}<tool_call|>", "call:NAME{"),
        ('<|tool_call>call:run{command:"ls"}<tool_call|>', "expected a value"),
        ('<|tool_call>call:run{command:<|"|>ls}<tool_call|>', "unterminated string"),
        ("<|tool_call>call:run{a:1,a:2}<tool_call|>", "given twice"),
        ("<|tool_call>call:run{a:1} then<tool_call|>", "text after the arguments"),
        ("<|tool_call>call:run{a:1", "not closed"),
    ],
)
def test_malformed_calls_stay_text_and_are_reported(text: str, why: str) -> None:
    assert_left_as_text(parse(text), text, why)


# A tool of every kind of value the template writes, for the grammar.
TYPED = run_tool(
    {
        "command": {"type": "string"},
        "timeout": {"type": "integer"},
        "Env": {"type": "object", "properties": {"HOME": {"type": "string"}}},
        "args": {"type": "array", "items": {"type": "string"}},
        "mode": {"enum": ["fast", "slow"]},
        "ratio": {"type": ["number", "null"]},
        "dry": {"type": "boolean"},
        "extra": {"type": "object"},
    }
)
GRAMMAR_TOOLS = [TYPED, LIST_DIR]
constraint = FamilyUnderTest("gemma4", GEMMA4, GRAMMAR_TOOLS).constraint


def written(*calls: ToolCall, reasoning: str | None = None) -> str:
    """A model turn's calls as the template writes them (and the model samples them), up to the
    ``<|tool_response>`` that ends them."""
    turn = Message(role="assistant", content="", tool_calls=calls, reasoning=reasoning)
    result = Message(role="tool", tool_call_id=calls[0].id, content="ok")
    dicts = [m.template_dict() for m in (USER, turn, result)]
    text = str(tokenizer().apply_chat_template(dicts, tools=GRAMMAR_TOOLS, tokenize=False))
    return text.split("<|turn>model\n")[-1].split(RESULTS)[0]


def typed_call(arguments: dict[str, Any], name: str = "run") -> ToolCall:
    return ToolCall(id=f"c-{name}", name=name, arguments=json.dumps(arguments))


def test_xgrammar_admits_what_the_template_writes_and_nothing_else() -> None:
    """Compiled by xgrammar on the family's vocabulary, as vLLM compiles it: the template's calls
    (every kind of value, optional arguments left out, two calls, after reasoning) are admitted
    and then <|tool_response>, the request's stop token, ends the turn; an undeclared tool or
    key, a mistyped value and keys out of the template's order are not."""
    full = {
        "command": 'ls "a" 😀',
        "timeout": 30,
        "Env": {"HOME": "/root"},
        "args": ["-l", "x y"],
        "mode": "fast",
        "ratio": -1.5e-05,
        "dry": False,
        "extra": {"a": [1, None], "b": {"c": True}},
    }
    one = written(typed_call(full))
    # Jinja's dictsort ignores case: ``Env`` after ``dry``; nested keys bare.
    assert ',dry:false,Env:{HOME:<|"|>/root<|"|>},extra:{a:[1,null],' in one
    few = written(typed_call({"command": "ls", "ratio": None}))
    assert few == '<|tool_call>call:run{command:<|"|>ls<|"|>,ratio:null}<tool_call|>'
    two = written(typed_call({"command": "a"}), typed_call({}, "list_dir"))
    thought = written(typed_call({"command": "a"}), reasoning="Think.")
    assert thought.startswith("<|channel>thought\nThink.\n<channel|><|tool_call>")
    cases = {
        "named": (constraint("named"), one),
        "optional_left_out": (constraint("required"), few),
        "parallel": (constraint("required", parallel=True), two),
        "reasoning": (constraint("required", reasoning=True), thought),
        "undeclared_tool": (constraint("required"), few.replace("call:run", "call:rm")),
        "undeclared_key": (constraint("required"), few.replace("ratio:", "rate:")),
        "mistyped": (constraint("required"), few.replace("null", '<|"|>1<|"|>')),
        "unsorted": (
            constraint("required"),
            '<|tool_call>call:run{ratio:null,command:<|"|>ls<|"|>}<tool_call|>',
        ),
    }
    assert constraint("named").count('"type":"token"') >= 4  # call markers and quotes by id
    assert admitted("gemma4", RESULTS, cases) == {
        "named": True,
        "optional_left_out": True,
        "parallel": True,
        "reasoning": True,
        "undeclared_tool": False,
        "undeclared_key": False,
        "mistyped": False,
        "unsorted": False,
    }


@pytest.mark.parametrize(
    "parameters",
    [{"type": "object", "properties": {"a b": {"type": "string"}}}, {"type": "string"}],
)
def test_a_tool_the_format_cannot_write_is_refused(parameters: dict[str, Any]) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(ValueError, match=r"cannot be written|object schema"):
        grammar.tool_call_constraint(GEMMA4, [tool], "required", None, UNDER_TEST.token_id)

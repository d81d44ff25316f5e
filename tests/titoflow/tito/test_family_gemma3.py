"""Gemma 3 (pythonic calls through vLLM's template): the template as vendored and detected
(Google's own, without tools, not), the stand-in vocabulary's markers, the history the template
writes (calls without commas between arguments, results in ``<tool_response>``, conversations it
refuses), and the parser on the shapes Gemma 3 writes. Parity with vLLM's ``pythonic`` parser
and the corpus proof are in test_parser_parity.py and test_family_corpus.py; the forced-call
grammar is Llama 4's, compiled by xgrammar in test_family_llama4.py."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from cli.dev.tokenizers import STAMP, template_path, tokenizer_dir
from cli.dev.tokenizers.gemma3 import BOS, EOS, MARKERS, PAD, TEMPLATE
from tests.support.families import family_tokenizer
from tests.support.family_corpus import TEMPLATE_REFUSES, in_family_ids, renderer_of
from tests.titoflow.tito.corpus import corpus
from titoflow.errors import TemplateError
from titoflow.tito.families import detect_family
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.gemma3 import GEMMA3
from titoflow.tito.families.llama4 import LLAMA4
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput
from titoflow.tito.tokenizer import TextEncoder

# vllm-project/vllm examples/tool_chat_template_gemma3_pythonic.jinja @c6991a3, as vendored.
TEMPLATE_SHA256 = "659a5b7f8c93ba6364ddd81b0e0224b3c98987268bfe03f2c8a01a18c1087a15"
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
TOOLS = [RUN, {"type": "function", "function": {"name": "list_dir", "description": "List"}}]
USER = Message(role="user", content="go")


def tokenizer() -> Any:
    return family_tokenizer("gemma3")


def render(messages: list[Message], **kwargs: Any) -> str:
    dicts = [m.template_dict() for m in messages]
    return str(tokenizer().apply_chat_template(dicts, tools=TOOLS, tokenize=False, **kwargs))


def parse(text: str) -> ParsedOutput:
    parser = GEMMA3.parser(ParserOptions("step", tools=TOOLS))
    parser.feed(text)
    return parser.finish()[1]


def test_the_template_is_the_vendored_file_and_detected() -> None:
    text = template_path(TEMPLATE).read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == TEMPLATE_SHA256
    assert tokenizer().chat_template == text
    assert detect_family(text) is GEMMA3
    # Google's own Gemma 3 template has the same turns and no tool format: without the
    # pythonic instruction nothing is detected (its tools would vanish from the prompt).
    with pytest.raises(ValueError, match="no known model family"):
        detect_family(text.replace("[func_name1(", "{"))


def test_the_stand_in_vocabulary_has_gemmas_markers_as_special_tokens() -> None:
    encode = TextEncoder(tokenizer())
    for marker in (BOS, EOS, PAD, *MARKERS):
        assert len(encode(marker)) == 1, marker
        assert marker in tokenizer().all_special_tokens, marker
    assert json.loads((tokenizer_dir("gemma3") / STAMP).read_text())["stand_in"]


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
    parsed = parse(text)
    assert parsed.parse_error is None and parsed.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == calls


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
    parsed = parse(text)
    assert parsed.tool_calls == [] and parsed.content == text
    assert parsed.parse_error is not None and why in parsed.parse_error


def test_a_python_tag_is_not_gemmas() -> None:
    """Llama 4's ``<|python_start|>`` opens a call there, none here: Gemma has no such tag."""
    text = '<|python_start|>[run(command="ls")]<|python_end|>'
    llama4 = LLAMA4.parser(ParserOptions("step", tools=TOOLS))
    llama4.feed(text)
    assert [c.name for c in llama4.finish()[1].tool_calls] == ["run"]
    parsed = parse(text)
    assert parsed.tool_calls == [] and parsed.parse_error is not None

"""Llama 4 (pythonic calls): its tokenizer against Meta's own (``llama-models``' tiktoken
``Tokenizer``), its template as vendored and detected, the history the template writes, the
parser on the shapes Llama 4 writes, and the forced-call grammar as xgrammar compiles it on the
family's vocabulary (as vLLM does). Parity with vLLM's parser and the corpus proof are in
test_parser_parity.py and test_family_corpus.py."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest
from llama_models.llama4.tokenizer import Tokenizer  # type: ignore[import-untyped]

from cli.dev.tokenizers import llama4 as recipe
from cli.dev.tokenizers import template_path, tokenizer_dir
from tests.support.families import family_token_id, family_tokenizer
from tests.titoflow.tito.hostile import CORPUS
from tests.titoflow.tito.xgrammar_check import admitted, structural_tag
from titoflow.tito.families import detect_family, grammar
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.llama4 import LLAMA4
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput
from titoflow.tito.tokenizer import TextEncoder

# vllm-project/vllm examples/tool_chat_template_llama4_pythonic.jinja @0471aed, as vendored.
TEMPLATE_SHA256 = "70aeb214dc6adc9eea1b68a344912469b94250c358a50840d51955057f766a09"
RUN = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "maxLength": 12},
                "timeout": {"type": "integer"},
            },
            "required": ["command"],
        },
    },
}
LIST_DIR = {"type": "function", "function": {"name": "list_dir", "description": "List"}}
TOOLS = [RUN, LIST_DIR]
USER = Message(role="user", content="go")
HEADER = "<|header_start|>assistant<|header_end|>\n\n"


def tokenizer() -> Any:
    return family_tokenizer("llama4")


token_id = family_token_id("llama4")


def render(messages: list[Message], **kwargs: Any) -> str:
    dicts = [m.template_dict() for m in messages]
    return str(tokenizer().apply_chat_template(dicts, tools=TOOLS, tokenize=False, **kwargs))


def call(arguments: dict[str, Any], name: str = "run", index: int = 0) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))


def parse(text: str) -> ParsedOutput:
    parser = LLAMA4.parser(ParserOptions("step", tools=TOOLS))
    parser.feed(text)
    return parser.finish()[1]


def test_ids_are_metas() -> None:
    """Meta's tokenizer (``llama-models``' tiktoken one) and the converted directory give the
    same ids: the hostile strings, 2,000 random texts, and text framed by special tokens."""
    meta = Tokenizer.get_instance()
    assert len(tokenizer()) == meta.n_words == 202048
    for marker in ("<|begin_of_text|>", "<|header_start|>", "<|eot|>", "<|python_start|>"):
        assert token_id(marker) == meta.special_tokens[marker], marker
    rng = random.Random(7)
    alphabet = "abc XYZ 0123 \n\t\r.,;:!?'\"{}[]()=éü中文🙂-_/\\\u00a0"
    texts = CORPUS + ["".join(rng.choices(alphabet, k=rng.randint(1, 80))) for _ in range(2000)]
    encode = TextEncoder(tokenizer())
    for text in texts:
        assert encode(text) == meta.encode(text, bos=False, eos=False), text
    framed = HEADER + '[run(command="ls")]<|eot|>'
    assert encode(framed) == meta.encode(framed, bos=False, eos=False, allowed_special="all")
    assert json.loads((tokenizer_dir("llama4") / "titoflow-tokenizer.json").read_text())[
        "stand_in"
    ] in ("", None)
    assert recipe.STAND_IN == ""


def test_the_template_is_the_vendored_file_and_detected() -> None:
    text = template_path(recipe.TEMPLATE).read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == TEMPLATE_SHA256
    assert tokenizer().chat_template == text
    assert detect_family(text) is LLAMA4
    # Meta's own Llama 4 template (JSON calls) is not this family's: without the pythonic
    # instruction, the same markers detect nothing.
    with pytest.raises(ValueError, match="no known model family"):
        detect_family(text.replace("[func_name1(", "{"))


def test_the_generation_prompt_and_what_history_writes() -> None:
    prompt = render([USER], add_generation_prompt=True)
    assert prompt.endswith("<|eot|><|header_start|>user<|header_end|>\n\ngo<|eot|>" + HEADER)
    # The tool list itself is not written: the template reads it only from custom_tools.
    assert "Here is a list of functions in JSON format that you can invoke:\n<|eot|>" in prompt
    assert '"list_dir"' not in prompt
    turn = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 30}),))
    result = Message(role="tool", tool_call_id="call_0", content='a.py\n"b"')
    loop = render([USER, turn, result], add_generation_prompt=True)
    # Every argument as k="%s" (call_arguments_rewritten); the result as a JSON string.
    assert HEADER + '[run(command="ls", timeout="30")]<|eot|>' in loop
    assert '<|header_start|>ipython<|header_end|>\n\n"a.py\\n\\"b\\""<|eot|>' in loop
    assert "call_arguments_rewritten" in LLAMA4.divergences


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('[run(command="ls", timeout=30)]', [("run", {"command": "ls", "timeout": 30})]),
        ("[run(command='ls'), list_dir()]", [("run", {"command": "ls"}), ("list_dir", {})]),
        (
            '<|python_start|>[run(command="a", env={"A": null, "B": true})]<|python_end|>',
            [("run", {"command": "a", "env": {"A": None, "B": True}})],
        ),
        ("[run(command=f'x', timeout=-1)]\n", [("run", {"command": "x", "timeout": -1})]),
    ],
)
def test_call_lists_are_read(text: str, calls: list[tuple[str, Any]]) -> None:
    parsed = parse(text)
    assert parsed.parse_error is None and parsed.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == calls


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[run("ls")]', "positional arguments"),
        ("[run(command=x)]", "not a literal"),
        ("[run(timeout=1e999)]", "not a finite number"),
        ('[run(command="ls")', "invalid Python"),
        ('[tools.run(command="ls")]', "not a plain name"),
        ('[run(command="ls"), 3]', "not a call"),
        ('I will. [run(command="ls")]', "a call list inside text"),
    ],
)
def test_malformed_call_lists_stay_text_and_are_reported(text: str, why: str) -> None:
    parsed = parse(text)
    assert parsed.tool_calls == [] and parsed.content == text
    assert parsed.parse_error is not None and why in parsed.parse_error


@pytest.mark.parametrize("text", ["[1, 2, 3]", "[see the docs](https://x)", "[]", "Plain."])
def test_other_text_is_content(text: str) -> None:
    parsed = parse(text)
    assert (parsed.content, parsed.tool_calls, parsed.parse_error) == (text, [], None)


def constraint(choice: grammar.ToolChoice, **options: Any) -> str:
    return structural_tag(LLAMA4, TOOLS, choice, token_id, **options)


def test_xgrammar_admits_a_call_list_the_parser_reads() -> None:
    """Compiled by xgrammar on the family's vocabulary, as vLLM compiles it: a call list with
    the required arguments as JSON values is admitted, then <|eot|> ends the turn; an optional
    argument, a string past its maxLength and text before the list are not."""
    named = '[run(command="ls -la")]'
    parallel = '[run(command="a"), list_dir(), run(command="b")]'
    cases = {
        "named": (constraint("named"), named),
        "parallel": (constraint("required", parallel=True), parallel),
        "optional": (constraint("named"), '[run(command="ls", timeout=3)]'),
        "too_long": (constraint("named"), '[run(command="ls -la /tmp/x")]'),
        "text_first": (constraint("required"), "Sure. " + named),
    }
    result = admitted("llama4", "<|eot|>", cases)
    assert result == {
        "named": True,
        "parallel": True,
        "optional": False,
        "too_long": False,
        "text_first": False,
    }
    assert [c.name for c in parse(parallel).tool_calls] == ["run", "list_dir", "run"]
    assert json.loads(parse(named).tool_calls[0].arguments) == {"command": "ls -la"}

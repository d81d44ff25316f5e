"""Llama 4 (pythonic calls): its tokenizer against Meta's own (``llama-models``' tiktoken
``Tokenizer``), its template as vendored and detected, the history the template writes, the
parser on the shapes Llama 4 writes, and the forced-call grammar as xgrammar compiles it on the
family's vocabulary (as vLLM does). Parity with vLLM's parser and the corpus proof are in
test_parser_parity.py and test_family_corpus.py."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from llama_models.llama4.tokenizer import Tokenizer  # type: ignore[import-untyped]

from cli.dev.tokenizers import llama4 as recipe
from tests.support.family_checks import (
    LIST_DIR,
    USER,
    FamilyUnderTest,
    assert_left_as_text,
    assert_only_calls,
    run_tool,
)
from tests.support.family_checks import tool_call as call
from tests.support.hostile import CORPUS
from tests.support.xgrammar_check import admitted
from titoflow.tito.families import detect_family
from titoflow.tito.families.llama4 import LLAMA4
from titoflow.tito.messages import Message
from titoflow.tito.tokenizer import TextEncoder

# vllm-project/vllm examples/tool_chat_template_llama4_pythonic.jinja @0471aed, as vendored.
TEMPLATE_SHA256 = "70aeb214dc6adc9eea1b68a344912469b94250c358a50840d51955057f766a09"
TOOLS = [
    run_tool({"command": {"type": "string", "maxLength": 12}, "timeout": {"type": "integer"}}),
    LIST_DIR,
]
HEADER = "<|header_start|>assistant<|header_end|>\n\n"
UNDER_TEST = FamilyUnderTest("llama4", LLAMA4, TOOLS)
tokenizer, token_id, render = UNDER_TEST.tokenizer, UNDER_TEST.token_id, UNDER_TEST.render
parse, constraint = UNDER_TEST.parse, UNDER_TEST.constraint


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
    assert UNDER_TEST.stand_in() in ("", None)
    assert recipe.STAND_IN == ""


def test_the_template_is_the_vendored_file_and_detected() -> None:
    text = UNDER_TEST.vendored_template(recipe.TEMPLATE, TEMPLATE_SHA256)
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
    assert_only_calls(parse(text), calls)


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
    assert_left_as_text(parse(text), text, why)


@pytest.mark.parametrize("text", ["[1, 2, 3]", "[see the docs](https://x)", "[]", "Plain."])
def test_other_text_is_content(text: str) -> None:
    parsed = parse(text)
    assert (parsed.content, parsed.tool_calls, parsed.parse_error) == (text, [], None)


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

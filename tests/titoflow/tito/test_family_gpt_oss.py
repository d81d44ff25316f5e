"""gpt-oss (harmony): the tokenizer is OpenAI's o200k_harmony, the official template renders what
openai-harmony (the reference renderer) renders, the parser reads both the model's and the
template's forms of a turn, and a TITO prompt differs from the full render only by the
template's declared history rewrites.

The renderer reads what harmony needs from the family: reasoning under ``thinking``, and an
assistant turn in history ending at the first of ``<|return|>``, ``<|call|>`` or ``<|end|>``
(a calling turn ends with ``<|call|>``, a past final answer with ``<|end|>``).
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from cli.dev.tokenizers import tokenizer_dir
from tests.support.corpus import ARGUMENTS, PROBE, REASONING, RESULTS, TOOLS
from tests.support.families import family_tokenizer
from tests.support.family_corpus import echoed
from titoflow.tito.families import detect_family
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.gpt_oss import GPT_OSS, parse_header
from titoflow.tito.families.grammar import tool_call_constraint
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput, ReasoningDelta, TextDelta, ToolCallDone
from titoflow.tito.render import ChatRenderer

# openai-harmony reads o200k_base.tiktoken from here (the tokenizer build writes it), never the
# network; set before the import, which reads it when an encoding is loaded.
os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(tokenizer_dir("gpt_oss"))
harmony = importlib.import_module("openai_harmony")  # a dev dependency: fail if missing


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(family_tokenizer("gpt_oss"))


@pytest.fixture(scope="module")
def encoding() -> Any:
    return harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


def ids(renderer: ChatRenderer, *texts: str) -> list[int]:
    return [i for text in texts for i in renderer.encode(text)]


def decode(renderer: ChatRenderer, tokens: list[int]) -> str:
    """The text the ingress gives the parser (special tokens kept)."""
    tokenizer: Any = renderer.tokenizer
    return str(tokenizer.decode(tokens))


# --- the tokenizer ----------------------------------------------------------------------------


def test_the_tokenizer_is_o200k_harmony(renderer: ChatRenderer, encoding: Any) -> None:
    tokenizer: Any = renderer.tokenizer
    # tiktoken's o200k_base: "hello world" is two tokens, the special tokens their ids.
    assert renderer.encode("hello world") == [24912, 2375]
    specials = {
        "<|startoftext|>": 199998,
        "<|endoftext|>": 199999,
        "<|return|>": 200002,
        "<|constrain|>": 200003,
        "<|channel|>": 200005,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|call|>": 200012,
        "<|endofprompt|>": 200018,
    }
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in specials} == specials
    assert len(tokenizer) == 200019
    rng = random.Random(7)
    alphabet = "ab AB 1 2 .,;:'\"\n\t \u00e9\u4e2d\U0001f600<|>_-/\\\r's"
    texts = [
        "Hello, world! 日本語 🚀\n\n  def f(x):\n\treturn x**2  # ok",
        "I'm don't THEY'LL 12345678 3.14159 naïve café",
        "Здравствуйте, мир! مرحبا بالعالم שלום עולם नमस्ते दुनिया",
        '{"a": [1, 2, {"b": "ü"}], "c": true}\r\n\r\n   ',
        "<|start|>assistant<|channel|>analysis<|message|>hi<|end|><|call|><|constrain|>json",
        *("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(300)),
    ]
    for text in texts:
        assert renderer.encode(text) == encoding.encode(text, allowed_special="all"), text
        assert decode(renderer, renderer.encode(text)) == text


def test_detection_and_stop_tokens(renderer: ChatRenderer) -> None:
    assert detect_family(renderer.tokenizer.chat_template) is GPT_OSS
    assert renderer.terminator == "<|return|>"
    assert renderer.end_ids == {200002, 200012}


# --- the template against openai-harmony ------------------------------------------------------


def test_the_template_renders_what_harmony_renders(renderer: ChatRenderer, encoding: Any) -> None:
    """A tool conversation, as the official template and the reference renderer write it: the
    same tokens, given harmony the template's conventions (content type ``json``, not
    ``<|constrain|>json``; a tool result as a JSON string)."""
    h = harmony
    tools = [TOOLS[0], TOOLS[1]]
    developer = h.DeveloperContent.new().with_instructions("Be careful.")
    developer = developer.with_function_tools(
        [
            h.ToolDescription.new(
                t["function"]["name"], t["function"]["description"], t["function"]["parameters"]
            )
            for t in tools
        ]
    )
    args = {"command": "ls", "timeout": 5}
    today = datetime.date.today().isoformat()
    system = h.SystemContent.new().with_conversation_start_date(today)
    reference = [
        h.Message.from_role_and_content(h.Role.SYSTEM, system),
        h.Message.from_role_and_content(h.Role.DEVELOPER, developer),
        h.Message.from_role_and_content(h.Role.USER, "List the files."),
        h.Message.from_role_and_content(h.Role.ASSISTANT, "Run ls.").with_channel("analysis"),
        h.Message.from_role_and_content(h.Role.ASSISTANT, json.dumps(args))
        .with_channel("commentary")
        .with_recipient("functions.run")
        .with_content_type("json"),
        h.Message.from_author_and_content(
            h.Author.new(h.Role.TOOL, "functions.run"), json.dumps("a.py\nb.py")
        )
        .with_channel("commentary")
        .with_recipient("assistant"),
    ]
    call = ToolCall(id="c1", name="run", arguments=json.dumps(args))
    ours = [
        Message(role="system", content="Be careful."),
        Message(role="user", content="List the files."),
        Message(role="assistant", reasoning="Run ls.", tool_calls=(call,)),
        Message(role="tool", content="a.py\nb.py", tool_call_id="c1"),
    ]
    conversation = harmony.Conversation.from_messages(reference)
    expected = encoding.render_conversation_for_completion(conversation, harmony.Role.ASSISTANT)
    assert renderer.full_prompt(ours, tools, {}) == expected
    # After a final answer both drop the analysis of the turns before it.
    reference += [
        h.Message.from_role_and_content(h.Role.ASSISTANT, "a.py, b.py").with_channel("final"),
        h.Message.from_role_and_content(h.Role.USER, "Thanks."),
    ]
    ours += [
        Message(role="assistant", content="a.py, b.py", reasoning="Easy."),
        Message(role="user", content="Thanks."),
    ]
    conversation = harmony.Conversation.from_messages(reference)
    expected = encoding.render_conversation_for_completion(conversation, harmony.Role.ASSISTANT)
    assert renderer.full_prompt(ours, tools, {}) == expected


# --- the parser -------------------------------------------------------------------------------


def parse(text: str, tools: Sequence[Any] = TOOLS, parse_tools: bool = True) -> ParsedOutput:
    parser = GPT_OSS.parser(ParserOptions("step", tools=tools, parse_tools=parse_tools))
    parser.feed(text)
    return parser.finish()[1]


def model_form(reasoning: str | None, name: str | None, body: str) -> str:
    """A turn as gpt-oss writes it (and openai-harmony parses it), its stop token removed."""
    text = ""
    if reasoning:
        text = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant"
    if name is None:
        return text + f"<|channel|>final<|message|>{body}"
    return text + f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}"


MODEL_OUTPUTS = [
    model_form("Read it first.", "read_file", '{"path":"README.md"}'),
    model_form(None, "run", json.dumps({"command": "echo 'naïve 漢字 🙂'", "background": True})),
    model_form("All good.", None, "Done: the **tests** pass.\n\nBye <3"),
    model_form(None, None, "Short < answer | with > markers"),
    model_form("", "list_dir", "{}"),
    # A preamble in the commentary channel, then the call (the template form of the call).
    "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.run"
    '<|channel|>commentary json<|message|>{"command": "ls"}',
]


def test_the_parser_agrees_with_harmony(renderer: ChatRenderer, encoding: Any) -> None:
    """openai-harmony's parse of the model's tokens names the same channels, recipients and
    texts as our parser's result."""
    for text in MODEL_OUTPUTS:
        stop = "<|call|>" if "to=functions." in text else "<|return|>"
        tokens = renderer.encode(text + stop)
        messages = encoding.parse_messages_from_completion_tokens(tokens, harmony.Role.ASSISTANT)
        parsed = parse(text)
        reasoning = [m.content[0].text for m in messages if m.channel == "analysis"]
        calls = [
            (m.recipient.removeprefix("functions."), json.loads(m.content[0].text))
            for m in messages
            if m.recipient and m.recipient.startswith("functions.")
        ]
        content = [
            m.content[0].text for m in messages if m.channel != "analysis" and not m.recipient
        ]
        assert parsed.reasoning == ("".join(reasoning) if reasoning else None), text
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == calls, text
        assert parsed.content == "".join(content), text
        assert parsed.parse_error is None


def test_streaming_and_whole_parsing_agree_on_every_split() -> None:
    malformed = model_form("x", "run", '{"command": "ls"')
    for text in [*MODEL_OUTPUTS, malformed, "no harmony at all", "<|end|>stray<|start|>"]:
        whole = parse(text)
        for cut in range(len(text) + 1):
            parser = GPT_OSS.parser(ParserOptions("step", tools=TOOLS))
            deltas = parser.feed(text[:cut]) + parser.feed(text[cut:])
            last, summary = parser.finish()
            assert summary == whole, (cut, text)
            deltas += last
            streamed = "".join(d.text for d in deltas if isinstance(d, TextDelta))
            assert streamed == whole.content
            thought = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
            assert thought == (whole.reasoning or "")
            assert [d.call for d in deltas if isinstance(d, ToolCallDone)] == whole.tool_calls


def test_a_malformed_call_is_text_with_a_parse_error() -> None:
    text = model_form("Edit it.", "read_file", f'{{"path": "src/{PROBE}')  # cut off
    parsed = parse(text)
    assert parsed.tool_calls == []
    assert parsed.reasoning == "Edit it."
    assert parsed.content == text[text.index("<|start|>") :], "the message exactly as generated"
    assert parsed.parse_error is not None and "read_file" in parsed.parse_error
    not_an_object = parse(model_form(None, "run", "[1, 2]"))
    assert not_an_object.tool_calls == [] and not_an_object.parse_error is not None


def test_a_call_inside_reasoning_is_not_a_call() -> None:
    call = model_form(None, "run", '{"command": "rm -rf /"}')
    parsed = parse(model_form(f"Maybe {call}?", None, "Done."))
    assert parsed.tool_calls == []
    assert parsed.reasoning == f"Maybe {call}?"
    assert parsed.content == "Done."


def test_without_tools_a_call_stays_text() -> None:
    text = model_form("Hm.", "run", '{"command": "ls"}')
    parsed = parse(text, parse_tools=False)
    assert parsed.tool_calls == [] and parsed.parse_error is None
    assert parsed.content == text[text.index("<|start|>") :]
    # A recipient that is not a function (a built-in tool) is not a call either.
    browser = parse("<|channel|>analysis to=browser.search code<|message|>{}")
    assert browser.tool_calls == [] and browser.content.endswith("{}")


def test_headers_in_either_order() -> None:
    assert parse_header("<|channel|>commentary to=functions.a <|constrain|>json") == parse_header(
        " to=functions.a<|channel|>commentary json"
    )
    assert parse_header(" to=a<|channel|>commentary to=b") is None
    # As openai-harmony reads them: whitespace between the parts, the channel written again.
    spaced = parse_header("\n assistant<|channel|>commentary  to=functions.a  json ")
    again = parse_header("assistant<|channel|>commentary to=functions.a<|channel|>commentary json")
    assert spaced == again == parse_header("assistant<|channel|>commentary to=functions.a json")
    assert parse_header("<|channel|>commentary to=functions.a<|channel|>analysis") is None


def test_an_addressed_message_not_read_as_a_call_is_a_parse_error() -> None:
    """With tools on, what addresses a recipient but is no call is text with parse_error."""
    for text in [
        model_form("r", None, "x").replace("final", "commentary to=browser.search"),
        "<|channel|>commentary to=functions.run <|constrain|>js",  # the output ends in it
        "<|channel|>commentary to=functions.run json<|call|>",  # no <|message|>
        "<|channel|>commentary to=functions.run <|constrain|> json<|message|>{}",  # no type
        "<|channel|>analysis<|message|>r<|start|>assistant<|channel|>final<|message|>x",
    ]:
        parsed = parse(text)
        assert parsed.tool_calls == [] and parsed.parse_error is not None, text
        assert parse(text, parse_tools=False).parse_error is None, text


# --- TITO: the continuation against the full render -------------------------------------------


@dataclass(frozen=True)
class Turn:
    history: tuple[Message, ...]
    answer: Message
    prompt: list[int]
    full: list[int]
    continuation: list[int]


def agent_loop(seed: int, turns: int, thinking: bool) -> tuple[Message, ...]:
    """A tool loop as gpt-oss runs one: one call per turn (the model stops at its first
    <|call|>), final answers now and then, a user follow-up after each."""
    rng = random.Random(seed)
    messages = [
        Message(role="system", content="You are a careful coding agent."),
        Message(role="user", content="Fix the failing test, please."),
    ]
    for turn in range(turns):
        reasoning = REASONING[turn % len(REASONING)] if thinking else None
        if turn == turns - 1 or rng.random() < 0.2:
            messages.append(Message(role="assistant", content="Done so far.", reasoning=reasoning))
            messages.append(Message(role="user", content="Go on. Check `docs/` too."))
            continue
        name, arguments = ARGUMENTS[rng.randrange(len(ARGUMENTS))]
        call = ToolCall(id=f"call_{turn}", name=name, arguments=json.dumps(arguments))
        # Without reasoning a calling turn's content is what the template writes as analysis.
        content = "" if thinking or rng.random() < 0.5 else "Let me check."
        messages.append(
            Message(role="assistant", content=content, reasoning=reasoning, tool_calls=(call,))
        )
        messages.append(
            Message(role="tool", content=RESULTS[rng.randrange(len(RESULTS))], tool_call_id=call.id)
        )
    return tuple(messages[:-1])


CONVERSATIONS = [
    ("plain", agent_loop(11, 12, False)),
    ("thinking", agent_loop(12, 12, True)),
    ("long", agent_loop(13, 40, True)),
]


def template_output(renderer: ChatRenderer, answer: Message, tools: Sequence[Any]) -> list[int]:
    """What the model generates for ``answer`` in the template's own form (rendered as the last
    turn, after a user turn, through its stop token)."""
    user = [Message(role="user", content="go")]
    prompt = renderer.full_prompt(user, tools, {})
    full = renderer.full_prompt([*user, answer], tools, {}, add_generation_prompt=False)
    assert full[: len(prompt)] == prompt
    rest = full[len(prompt) :]
    return rest[: next(i for i, t in enumerate(rest) if t in renderer.end_ids) + 1]


def model_output(renderer: ChatRenderer, answer: Message) -> list[int]:
    """What gpt-oss generates for ``answer``: recipient after the channel, ``<|constrain|>``,
    compact JSON."""
    if answer.tool_calls:
        (call,) = answer.tool_calls
        body = json.dumps(json.loads(call.arguments), separators=(",", ":"), ensure_ascii=False)
        return renderer.encode(model_form(answer.reasoning, call.name, body) + "<|call|>")
    return renderer.encode(model_form(answer.reasoning, None, answer.content) + "<|return|>")


def tito_turns(renderer: ChatRenderer, messages: Sequence[Message], form: str) -> Iterator[Turn]:
    chain: list[int] | None = None
    covered = 0
    for at, message in enumerate(messages):
        if message.role != "assistant":
            continue
        history = tuple(messages[:at])
        full = renderer.full_prompt(history, TOOLS, {})
        continuation: list[int] = []
        if chain is None:
            prompt = full
        else:
            continuation = renderer.continuation(history, covered, True, TOOLS, {})
            prompt = chain + continuation
        yield Turn(history, message, prompt, full, continuation)
        if form == "template":
            output = template_output(renderer, message, TOOLS)
        else:
            output = model_output(renderer, message)
        chain, covered = prompt + output, at + 1


def without_declared_divergences(renderer: ChatRenderer, tokens: list[int]) -> list[int]:
    """``tokens`` with the template's history rewrites undone on both sides: every analysis
    message cut out, every <|return|> written as <|end|>."""
    analysis = ids(renderer, "<|channel|>analysis<|message|>")
    resume = ids(renderer, "<|start|>assistant")
    end, ret = ids(renderer, "<|end|>", "<|return|>")
    out: list[int] = []
    at = 0
    while at < len(tokens):
        if tokens[at : at + len(analysis)] == analysis:
            at = tokens.index(end, at) + 1
            if tokens[at : at + len(resume)] == resume:  # the turn goes on: one opening kept
                at += len(resume)
            continue
        out.append(end if tokens[at] == ret else tokens[at])
        at += 1
    return out


@pytest.mark.parametrize(("name", "messages"), CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
def test_tito_equals_the_full_render_but_for_the_declared_divergences(
    renderer: ChatRenderer, name: str, messages: tuple[Message, ...]
) -> None:
    exact = diverged = 0
    for turn in tito_turns(renderer, messages, "template"):
        # The continuation is the full render's tail: what the scaffold sent, token for token.
        assert (
            turn.prompt[len(turn.prompt) - len(turn.continuation) :]
            == turn.full[len(turn.full) - len(turn.continuation) :]
        )
        answered = any(m.role == "assistant" and not m.tool_calls for m in turn.history)
        if turn.prompt == turn.full:
            exact += 1
            continue
        # Before any final answer the template is append-only; after one it rewrites history,
        # and only as declared (analysis dropped, <|return|> written <|end|>).
        assert answered, f"turn {len(turn.history)} diverged before any final answer"
        diverged += 1
        assert without_declared_divergences(renderer, turn.prompt) == (
            without_declared_divergences(renderer, turn.full)
        ), f"turn {len(turn.history)}"
    assert exact >= 2 and diverged >= 1


def test_tito_on_the_models_own_form(renderer: ChatRenderer) -> None:
    """With the model's form of the calls (recipient after the channel, <|constrain|>json,
    compact JSON) the template rewrites every past call; the continuation is still the full
    render's tail, and each assistant turn parses back to what the client echoes."""
    for turn in tito_turns(renderer, CONVERSATIONS[1][1], "model"):
        assert (
            turn.prompt[len(turn.prompt) - len(turn.continuation) :]
            == turn.full[len(turn.full) - len(turn.continuation) :]
        )
        text = decode(renderer, model_output(renderer, turn.answer)[:-1])
        parsed = parse(text)
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
            (c.name, json.loads(c.arguments)) for c in turn.answer.tool_calls
        ]
        assert parsed.reasoning == turn.answer.reasoning
        assert parsed.content == ("" if turn.answer.tool_calls else turn.answer.content)


@pytest.mark.parametrize(("name", "messages"), CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
def test_the_template_form_parses_back_to_the_same_tokens(
    renderer: ChatRenderer, name: str, messages: tuple[Message, ...]
) -> None:
    for answer in (m for m in messages if m.role == "assistant"):
        output = template_output(renderer, answer, TOOLS)
        text = decode(renderer, output[:-1])
        parsed = parse(text)
        assert parsed.parse_error is None, text
        assert template_output(renderer, echoed(parsed, answer), TOOLS) == output, text
        # The template writes a calling turn's content as analysis: it comes back as reasoning.
        expected = answer.reasoning or (answer.content if answer.tool_calls else "") or None
        assert parsed.reasoning == expected


def test_a_cut_off_turn_is_closed_as_the_template_closes_it(renderer: ChatRenderer) -> None:
    messages = CONVERSATIONS[0][1]
    at = next(i for i, m in enumerate(messages) if m.role == "assistant" and not m.tool_calls)
    continuation = renderer.continuation(messages[: at + 2], at + 1, False, TOOLS, {})
    assert continuation[0] == renderer.encode("<|end|>")[0]


# --- the grammar ------------------------------------------------------------------------------


def test_a_forced_call_is_the_models_form(renderer: ChatRenderer) -> None:
    constraint = tool_call_constraint(GPT_OSS, list(TOOLS), "named", "run", renderer.token_id)
    assert constraint is not None
    tag = json.loads(constraint["structured_outputs"]["structural_tag"])
    call = tag["format"]["elements"]
    [channel] = ids(renderer, "<|channel|>")
    # <|channel|>commentary to=functions.run <|constrain|>json<|message|>{arguments}
    assert call[0] == {"type": "token", "token": channel}
    assert call[1] == {"type": "const_string", "value": "commentary to=functions."}
    body = call[2]["elements"]
    assert body[0]["value"] == "run "
    assert body[1] == {"type": "token", "token": renderer.token_id("<|constrain|>")}
    assert body[4]["json_schema"] == TOOLS[1]["function"]["parameters"]
    with pytest.raises(ValueError, match="cannot be written"):
        tool_call_constraint(
            GPT_OSS, [{"name": "bad name", "parameters": {}}], "required", None, renderer.token_id
        )

"""The Llama 3.1+ family: its tokenizer against Meta's (tiktoken) encoding and chat format, its
detection, its parser, its grammar and its TITO continuations.

The shared corpus (tests/titoflow/tito/test_family_corpus.py) is proven here too, on the corpus as
this
template can express it: the official template renders one call per assistant turn (it raises on
more) and drops the content of a turn that calls a tool, so calling turns keep their first call
and no content.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import tiktoken

from cli.dev.tokenizers import llama3 as recipe
from cli.dev.tokenizers import template_path, tokenizer_dir
from tests.support.corpus import PROBE, TOOLS, Conversation, corpus
from tests.support.families import family_tokenizer
from titoflow.errors import TemplateError
from titoflow.tito.families import detect_family
from titoflow.tito.families.base import ParserOptions, tool_call_id
from titoflow.tito.families.grammar import tool_call_constraint
from titoflow.tito.families.llama3 import LLAMA3, PYTHON_TAG
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput, TextDelta, ToolCallDone
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer


def renderer() -> ChatRenderer:
    return ChatRenderer(family_tokenizer("llama3"))


def decode(ids: list[int], skip_special_tokens: bool = False) -> str:
    return str(family_tokenizer("llama3").decode(ids, skip_special_tokens=skip_special_tokens))


def meta_encoding() -> Any:
    specials = {token: recipe.BASE_VOCAB + i for i, token in enumerate(recipe.special_tokens())}
    ranks = recipe.load_ranks(recipe.ranks_path())
    return tiktoken.Encoding(
        "llama3", pat_str=recipe.PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )


# --- the tokenizer -----------------------------------------------------------------------------


def test_special_tokens_have_metas_ids() -> None:
    tokenizer = family_tokenizer("llama3")
    assert len(tokenizer) == 128256
    expected = {
        "<|begin_of_text|>": 128000,
        "<|end_of_text|>": 128001,
        "<|finetune_right_pad_id|>": 128004,
        "<|start_header_id|>": 128006,
        "<|end_header_id|>": 128007,
        "<|eom_id|>": 128008,
        "<|eot_id|>": 128009,
        "<|python_tag|>": 128010,
        "<|reserved_special_token_245|>": 128255,
    }
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in expected} == expected
    assert tokenizer.bos_token == "<|begin_of_text|>" and tokenizer.eos_token == "<|eot_id|>"
    assert tokenizer.encode("hi")[0] == 128000  # as Meta's HF tokenizer: BOS when asked for


SAMPLES = [
    "Hello, world!",
    "  leading spaces\n\n\ttabs\r\n and CRLF\r\n\r\n",
    "digits 1234567 and 3.14159, 1e-9",
    "don't I'LL we've THEY'RE",
    "naïve café 漢字 🙂 ÀÉÎ ß ﬁ",
    '{"name": "read_file", "parameters": {"path": "a b", "n": [1, 2.5, null]}}',
    "def f(x):\n    return x**2  # square\n\n\n",
    "\u00a0nbsp \u2003em\u200bzw",
    "a" * 500,
    "\n \n\t \n",
]


def test_encoding_is_tiktokens() -> None:
    tokenizer = family_tokenizer("llama3")
    meta = meta_encoding()
    rng = random.Random(7)
    alphabet = "abc XYZ 0123 \n\t\r.,;:!?'\"{}[]()éü中文🙂-_/\\\u00a0"
    texts = SAMPLES + ["".join(rng.choices(alphabet, k=rng.randint(1, 80))) for _ in range(2000)]
    for text in texts:
        assert tokenizer.encode(text, add_special_tokens=False) == meta.encode(text), text
    framed = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    assert tokenizer.encode(framed, add_special_tokens=False) == meta.encode(
        framed, allowed_special="all"
    )


def test_template_renders_what_metas_chat_format_encodes() -> None:
    """llama-models' ChatFormat (Meta's reference) and the official template agree on the
    tokens of a conversation: headers, the system preamble, ipython results."""
    chat_format = importlib.import_module("llama_models.llama3.chat_format")
    datatypes = importlib.import_module("llama_models.datatypes")
    tokenizer_module = importlib.import_module("llama_models.llama3.tokenizer")
    preamble = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    call_json = '{"name": "read_file", "parameters": {"path": "a"}}'
    result = 'line 1\n"quoted" ü'
    messages = [
        Message(role="system", content="You are terse."),
        Message(role="user", content="Read a."),
        Message(role="assistant", content="Sure."),
        Message(role="user", content="Now."),
    ]
    meta = chat_format.ChatFormat(tokenizer_module.Tokenizer.get_instance())
    raw = [
        datatypes.RawMessage(role="system", content=preamble + "You are terse."),
        datatypes.RawMessage(role="user", content="Read a."),
        datatypes.RawMessage(role="assistant", content="Sure.", stop_reason="end_of_turn"),
        datatypes.RawMessage(role="user", content="Now."),
    ]
    ours = renderer().full_prompt(messages, (), {})
    assert ours == meta.encode_dialog_prompt(raw).tokens
    # A tool call and its result: the template writes the result as a JSON string.
    with_call = [
        *messages[:2],
        Message(
            role="assistant",
            tool_calls=(ToolCall(id="c", name="read_file", arguments='{"path": "a"}'),),
        ),
        Message(role="tool", content=result, tool_call_id="c"),
    ]
    raw_call = [
        *raw[:2],
        datatypes.RawMessage(role="assistant", content=call_json, stop_reason="end_of_turn"),
        datatypes.RawMessage(role="tool", content=json.dumps(result, ensure_ascii=False)),
    ]
    assert renderer().full_prompt(with_call, (), {}) == meta.encode_dialog_prompt(raw_call).tokens


# --- detection ---------------------------------------------------------------------------------


def test_detection_picks_llama3_for_its_templates_and_no_other() -> None:
    for name in ("llama3.jinja", "llama3_2.jinja"):
        assert detect_family(template_path(name).read_text()) is LLAMA3
    others = [
        p for p in template_path("x").parent.glob("*.jinja") if not p.name.startswith("llama3")
    ]
    for path in others:
        assert not LLAMA3.detect(path.read_text()), path.name
    qwen3 = load_tokenizer(tokenizer_dir("qwen3")).chat_template
    assert not LLAMA3.detect(qwen3)


# --- the parser --------------------------------------------------------------------------------


def parse(text: str, tools: Sequence[Any] = TOOLS, parse_tools: bool = True) -> ParsedOutput:
    parser = LLAMA3.parser(ParserOptions("step", tools=tools, parse_tools=parse_tools))
    parser.feed(text)
    return parser.finish()[1]


def calls(parsed: ParsedOutput) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


CALL = '{"name": "read_file", "parameters": {"path": "a.py"}}'
CASES: list[tuple[str, str, list[tuple[str, Any]], bool]] = [
    # text, content, calls, parse error
    (CALL, "", [("read_file", {"path": "a.py"})], False),
    (f"  {CALL}\n", "", [("read_file", {"path": "a.py"})], False),
    (PYTHON_TAG + CALL, "", [("read_file", {"path": "a.py"})], False),
    ('{"type": "function", "name": "list_dir", "parameters": {}}', "", [("list_dir", {})], False),
    ('{"name": "list_dir", "arguments": {}}', "", [("list_dir", {})], False),
    ('{"name": "list_dir"}', "", [("list_dir", {})], False),
    (
        CALL + '; {"name": "run", "parameters": {"command": "ls", "timeout": 5}}',
        "",
        [("read_file", {"path": "a.py"}), ("run", {"command": "ls", "timeout": 5})],
        False,
    ),
    ("The answer is 4.", "The answer is 4.", [], False),
    ("\n\nHello <|reserved_special_token_9|>there.  \n", "Hello there.", [], False),
    ('{"result": 4}', '{"result": 4}', [], False),  # JSON, but no call: content
    ("[1, 2]", "[1, 2]", [], False),
    # A call only as the whole message; one inside text is text, with parse_error.
    (f"Let me look. {CALL}", f"Let me look. {CALL}", [], True),
    (f"```json\n{CALL}\n```", f"```json\n{CALL}\n```", [], True),
    (
        '{"name": "read_file", "parameters": {"path": "a',
        '{"name": "read_file", "parameters": {"path": "a',
        [],
        True,
    ),
    (f"{CALL} trailing", f"{CALL} trailing", [], True),
    (f"{CALL};", "", [("read_file", {"path": "a.py"})], False),
    (f"{CALL}\n{CALL}", "", [("read_file", {"path": "a.py"})] * 2, False),
    ('{"name": "run", "parameters": "ls"}', '{"name": "run", "parameters": "ls"}', [], True),
    (
        '{"name": "run", "parameters": {}, "id": 3}',
        '{"name": "run", "parameters": {}, "id": 3}',
        [],
        True,
    ),
    (PYTHON_TAG + "print(1)", PYTHON_TAG + "print(1)", [], True),  # a built-in call: not ours
]


@pytest.mark.parametrize(("text", "content", "expected", "error"), CASES)
def test_parser(text: str, content: str, expected: list[tuple[str, Any]], error: bool) -> None:
    parsed = parse(text)
    assert (parsed.content, calls(parsed), parsed.parse_error is not None) == (
        content,
        expected,
        error,
    )
    assert parsed.reasoning is None


def test_call_ids_are_the_steps() -> None:
    parsed = parse(CALL + ";" + CALL, tools=TOOLS)
    assert [c.id for c in parsed.tool_calls] == [tool_call_id("step", i) for i in range(2)]


@pytest.mark.parametrize("text", [CALL, PYTHON_TAG + CALL, '{"a": 1}'])
def test_without_tools_parsed_json_is_content(text: str) -> None:
    parsed = parse(text, tools=(), parse_tools=False)
    assert (parsed.content, parsed.tool_calls, parsed.parse_error) == (
        text.removeprefix(PYTHON_TAG),
        [],
        None,
    )


@pytest.mark.parametrize(
    "text", [case[0] for case in CASES] + ["a <|eot_id|> b < c <| d <|x", "<|pyt"]
)
def test_streaming_equals_whole_on_every_split(text: str) -> None:
    whole = parse(text)
    for cut in range(len(text) + 1):
        for cut2 in (cut, min(len(text), cut + 3)):
            parser = LLAMA3.parser(ParserOptions("step", tools=TOOLS))
            deltas = (
                parser.feed(text[:cut]) + parser.feed(text[cut:cut2]) + parser.feed(text[cut2:])
            )
            last, summary = parser.finish()
            assert summary == whole, (cut, cut2)
            streamed = "".join(d.text for d in [*deltas, *last] if isinstance(d, TextDelta))
            assert streamed == whole.content
            assert [
                d.call for d in [*deltas, *last] if isinstance(d, ToolCallDone)
            ] == whole.tool_calls


def test_content_streams_before_the_end() -> None:
    parser = LLAMA3.parser(ParserOptions("step", tools=TOOLS))
    assert parser.feed("Hello wor") == [TextDelta("Hello wor")]
    assert parser.feed("ld <|eot") == [TextDelta("ld")]  # a space and a possible token held
    assert parser.feed("_id|>!") == [TextDelta(" !")]


# --- the template's history and TITO ---------------------------------------------------------


def expressible(conversation: Conversation) -> Conversation:
    """The conversation as this template can render it: one call per turn, no content beside."""
    messages: list[Message] = []
    dropped: set[str] = set()
    for message in conversation.messages:
        if message.role == "assistant" and message.tool_calls:
            first = message.tool_calls[0]
            dropped |= {c.id for c in message.tool_calls[1:]}
            message = message.model_copy(update={"content": "", "tool_calls": (first,)})
        if message.role == "tool" and message.tool_call_id in dropped:
            continue
        messages.append(message)
    return Conversation(
        conversation.name, tuple(messages), conversation.tools, conversation.thinking
    )


CORPUS = [expressible(c) for c in corpus()]


def test_parallel_calls_are_rejected_by_the_official_template() -> None:
    two = tuple(ToolCall(id=f"c{i}", name="list_dir", arguments="{}") for i in range(2))
    conversation = [Message(role="user", content="hi"), Message(role="assistant", tool_calls=two)]
    with pytest.raises(TemplateError, match="single tool-calls"):
        renderer().full_prompt(conversation, TOOLS, {}, add_generation_prompt=False)


def generated(
    r: ChatRenderer, history: Sequence[Message], answer: Message, tools: Sequence[Any]
) -> list[int]:
    prompt = r.full_prompt(history, tools, {})
    full = r.full_prompt([*history, answer], tools, {}, add_generation_prompt=False)
    assert full[: len(prompt)] == prompt
    rest = full[len(prompt) :]
    return rest[: next(i for i, t in enumerate(rest) if t in r.end_ids) + 1]


def turns(
    r: ChatRenderer, conversation: Conversation
) -> Iterator[tuple[int, list[int], list[int]]]:
    """(index of the assistant message, TITO prompt, generated tokens) of each model call."""
    chain: list[int] | None = None
    covered = 0
    messages, tools = conversation.messages, conversation.tools
    for at, message in enumerate(messages):
        if message.role != "assistant":
            continue
        history = messages[:at]
        if chain is None:
            prompt = r.full_prompt(history, tools, {})
        else:
            prompt = chain + r.continuation(history, covered, True, tools, {})
        output = generated(r, history, message, tools)
        yield at, prompt, output
        chain, covered = prompt + output, at + 1


def text_of(r: ChatRenderer, output: list[int]) -> str:
    ids = output[:-1] if output[-1] in r.end_ids else output
    return decode(ids, skip_special_tokens=not LLAMA3.decode_special_tokens)


@pytest.mark.parametrize("conversation", CORPUS, ids=lambda c: c.name)
def test_corpus_tito_prompt_is_the_full_render(conversation: Conversation) -> None:
    r = renderer()
    for at, prompt, _ in turns(r, conversation):
        assert prompt == r.full_prompt(conversation.messages[:at], conversation.tools, {}), at


@pytest.mark.parametrize("conversation", CORPUS, ids=lambda c: c.name)
def test_corpus_parser_reads_back_what_the_template_renders(conversation: Conversation) -> None:
    r = renderer()
    tools = conversation.tools
    for at, _, output in turns(r, conversation):
        answer = conversation.messages[at]
        text = text_of(r, output)
        parsed = parse(text, tools, parse_tools=bool(tools))
        assert parsed.parse_error is None, text
        assert [(c.name, json.loads(c.arguments)) for c in answer.tool_calls] == calls(parsed)
        assert parsed.content == answer.content.strip()
        ids = tuple(
            ToolCall(id=a.id, name=p.name, arguments=p.arguments)
            for a, p in zip(answer.tool_calls, parsed.tool_calls, strict=True)
        )
        again = Message(role="assistant", content=parsed.content, tool_calls=ids)
        assert generated(r, conversation.messages[:at], again, tools) == output, text


def test_corpus_cut_off_call_is_text_with_a_parse_error() -> None:
    r = renderer()
    checked = 0
    for conversation in CORPUS:
        for _, _, output in turns(r, conversation):
            text = text_of(r, output)
            if PROBE in text:
                cut = text[: text.index(PROBE) + 3]
                parsed = parse(cut, conversation.tools)
                assert (parsed.content, parsed.tool_calls) == (cut, [])
                assert parsed.parse_error is not None
                checked += 1
    assert checked > 0


def test_a_turn_ended_by_eom_continues_with_the_tool_result() -> None:
    """A call opened with <|python_tag|> and ended by <|eom_id|> (Meta's ipython flow): the chain
    ends its turn there, and the result's ipython turn follows it directly."""
    r = renderer()
    assert r.terminator == "<|eot_id|>"
    assert r.stop_token_ids == (128009, 128008, 128001)
    call = ToolCall(id="c0", name="read_file", arguments='{"path": "a.py"}')
    history = [Message(role="user", content="Read a.py")]
    messages = [
        *history,
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", content="x = 1", tool_call_id="c0"),
    ]
    prompt = r.full_prompt(history, TOOLS, {})
    sampled = r.encode(PYTHON_TAG + CALL + "<|eom_id|>")
    parsed = parse(decode(sampled[:-1], skip_special_tokens=False))
    assert calls(parsed) == [("read_file", {"path": "a.py"})]
    continuation = r.continuation(messages, 2, sampled[-1] in r.end_ids, TOOLS, {})
    full = r.full_prompt(messages, TOOLS, {})
    # The template would have written the call without the tag and ended it with <|eot_id|>:
    # the chain keeps what was sampled, and what follows is the template's.
    assert full[-len(continuation) :] == continuation
    assert decode(continuation).startswith("<|start_header_id|>ipython<|end_header_id|>")
    assert prompt + sampled + continuation != full


def test_todays_date_changing_mid_session_re_renders_the_opening(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Llama 3.2's template writes today's date into the system turn (strftime_now): across
    midnight the renderer's memoized opening no longer matches, and it re-renders it."""
    import transformers.utils.chat_template_utils as chat_template_utils

    tokenizer = load_tokenizer(tokenizer_dir("llama3"))
    tokenizer.chat_template = template_path("llama3_2.jinja").read_text()
    r = ChatRenderer(tokenizer)
    assert r.family is LLAMA3
    conversation = CORPUS[1]
    messages, tools = conversation.messages, conversation.tools
    at = [i for i, m in enumerate(messages) if m.role == "assistant"]

    class Day(dt.datetime):
        current = dt.datetime(2026, 11, 25, 23, 59)

        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return cls.current

    monkeypatch.setattr(chat_template_utils, "datetime", Day)
    first = r.continuation(messages[: at[1]], at[0] + 1, True, tools, {})
    assert "25 Nov 2026" in r.render_text(messages[:2], tools, {}, False)
    Day.current = dt.datetime(2026, 11, 26, 0, 1)
    again = r.continuation(messages[: at[1]], at[0] + 1, True, tools, {})
    assert again == first  # the new messages' tokens do not depend on the date
    full = r.full_prompt(messages[: at[1]], tools, {})
    assert full[-len(again) :] == again
    assert "26 Nov 2026" in decode(full[:40])


# --- the grammar -------------------------------------------------------------------------------


def test_grammar_writes_the_call_as_the_template_does() -> None:
    r = renderer()
    constraint = tool_call_constraint(LLAMA3, list(TOOLS), "named", "run", r.token_id)
    assert constraint is not None
    tag = json.loads(constraint["structured_outputs"]["structural_tag"])
    body = tag["format"]
    assert [e["type"] for e in body["elements"]] == ["const_string", "json_schema", "const_string"]
    arguments = {"command": "ls", "timeout": 5}
    written = body["elements"][0]["value"] + json.dumps(arguments) + body["elements"][2]["value"]
    call = ToolCall(id="c", name="run", arguments=json.dumps(arguments))
    history = [Message(role="user", content="go")]
    rendered = text_of(
        r, generated(r, history, Message(role="assistant", tool_calls=(call,)), TOOLS)
    )
    assert written == rendered
    parallel = tool_call_constraint(
        LLAMA3, list(TOOLS), "required", None, r.token_id, parallel=True
    )
    assert parallel is not None and '"; "' in parallel["structured_outputs"]["structural_tag"]


def test_builtin_tools_call_turn_ends_with_eom() -> None:
    r = renderer()
    kwargs = {"builtin_tools": ["brave_search"]}
    call = ToolCall(id="c", name="read_file", arguments='{"path": "a"}')
    messages = [
        Message(role="user", content="hi"),
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", content="x", tool_call_id="c"),
    ]
    history = r.full_prompt(messages[:2], TOOLS, kwargs, add_generation_prompt=False)
    assert decode(history).endswith("<|eom_id|>")
    continuation = r.continuation(messages, 2, True, TOOLS, kwargs)
    assert history + continuation == r.full_prompt(messages, TOOLS, kwargs)

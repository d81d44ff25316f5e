"""Every registered model family, proven on the shared corpus (tests/titoflow/tito/corpus.py) with
its own tokenizer and chat template (cli/dev/tokenizers):

- TITO: every turn's prompt built as the chain (the previous prompt plus what the model
  generated) plus the continuation equals the template's full render token for token; a family
  whose template is not append-only by design declares its divergences, and then the
  continuation is still the full render's tail and everything the scaffold sent is in both, in
  order; where the template cannot continue the chain at all (it moves a later system message
  up front), the family declares it and the ingress renders that turn in full.
- The parser is exact: what the template renders as an assistant turn (what the model would
  generate) parses back to that message, and the parsed message renders to the same tokens.
- Streaming and whole parsing agree on every split of the text.
- A call cut off mid-arguments comes back as text with a parse error; a call written inside
  reasoning is not a call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from cli.dev.tokenizers import SOURCES
from tests.support.families import family_tokenizer
from tests.titoflow.tito.corpus import PROBE, Conversation, corpus, expressible
from titoflow.errors import NotAppendOnly
from titoflow.tito.families import FAMILIES, family_named
from titoflow.tito.families.base import Family, ParserOptions
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput
from titoflow.tito.render import ChatRenderer
from workers.rebuild import Rebuilder

# Tokens a generation prompt may add after the template's assistant opening.
GENERATION_DECORATION = 6
PROVEN = sorted(f.name for f in FAMILIES if f.name in SOURCES)
CORPUS = corpus()
# The template switch that turns a family's reasoning on or off, where it has one.
THINKING_SWITCH = {
    "qwen3": "enable_thinking",
    "qwen35": "enable_thinking",
    "nemotron3": "enable_thinking",
    "glm45": "enable_thinking",
    "deepseek_v3": "thinking",
}


def renderer_of(name: str) -> ChatRenderer:
    renderer = ChatRenderer(family_tokenizer(name))
    assert renderer.family is family_named(name), "detection picks the family of its template"
    return renderer


def in_family_ids(family: Family, conversation: Conversation) -> Conversation:
    """The conversation as the family's template can write it (:func:`expressible`), with the
    call ids a model of ``family`` writes itself, if it does."""
    conversation = replace(conversation, messages=expressible(family, conversation.messages))
    native = family.native_call_id
    if native is None:
        return conversation
    ids: dict[str, str] = {}
    messages = []
    for message in conversation.messages:
        calls = []
        for call in message.tool_calls:
            ids[call.id] = native(call.name, len(ids))
            calls.append(call.model_copy(update={"id": ids[call.id]}))
        answered = ids.get(message.tool_call_id or "", message.tool_call_id)
        messages.append(
            message.model_copy(update={"tool_calls": tuple(calls), "tool_call_id": answered})
        )
    return replace(conversation, messages=tuple(messages))


def template_kwargs(family: Family, conversation: Conversation) -> dict[str, Any]:
    switch = THINKING_SWITCH.get(family.name)
    return {switch: conversation.thinking} if switch else {}


@dataclass(frozen=True)
class Turn:
    """One model call of a conversation: its request, the assistant message it produced, the
    prompt TITO built for it, and the tokens the model generated (the template's own rendering
    of that message)."""

    history: tuple[Message, ...]
    answer: Message
    prompt: list[int]
    tail: int  # the prompt's last tokens that TITO rendered (all of it on the first call)
    output: list[int]


def output_ids(
    renderer: ChatRenderer,
    history: Sequence[Message],
    answer: Message,
    tools: Sequence[Any],
    kwargs: dict[str, Any],
) -> list[int]:
    """What a model generates for ``answer`` after ``history``: the template's rendering of the
    conversation with it, past the generation prompt's own tokens (found in the last turn: a
    template may re-render earlier turns once a later one follows), through the first stop
    token. A generation prompt that opened a reasoning block the template never writes back
    (DeepSeek V3.1 renders ``</think>`` there) is followed by the reasoning and the closing tag,
    what the model samples."""
    bare = renderer.full_prompt(history, tools, kwargs, add_generation_prompt=False)
    prompt = renderer.full_prompt(history, tools, kwargs)
    opening = prompt[len(bare) :] if prompt[: len(bare)] == bare else prompt[-1:]
    # A template that writes a final assistant message as a prefill of its generation prompt
    # (Nemotron Nano v2's) writes the model's turn only once a message follows it.
    follows = [_follower(answer)] if renderer.family.name in FINAL_TURN_PREFILLED else []
    full = renderer.full_prompt(
        [*history, answer, *follows], tools, kwargs, add_generation_prompt=False
    )
    sampled: list[int] = []
    # A generation prompt that adds nothing (DeepSeek's after a tool result, Mistral Nemo's): the
    # turn follows the history's last token (Nemo writes the system prompt into the last message
    # only, so the history itself is re-rendered once the turn follows it).
    at = _last(full, opening) if opening else len(bare) if full[: len(bare)] == bare else -1
    if at < 0 and not opening and (last := _last(full, bare[-1:])) >= 0:
        at = last + 1
    if 0 <= at < len(bare) and full[: len(bare)] == bare:  # an earlier turn's opening
        at = -1
    tags = renderer.family.reasoning_tags
    if at < 0 and tags and renderer.family.reasoning_open(renderer.tokenizer.decode(opening)):
        closed = renderer.encode(renderer.tokenizer.decode(opening)[: -len(tags[0])] + tags[1])
        at = _last(full, closed)
        if at >= 0:
            opening = closed
            sampled = renderer.encode((answer.reasoning or "") + tags[1])
    text = renderer.tokenizer.decode(opening)
    if at < 0 and tags and renderer.family.reasoning_open(text):
        # A template that writes no block for a turn without reasoning (MiniMax-M2's): the model
        # closed the block the prompt opened, empty as the template writes one ("\n</think>\n\n").
        # Found as text: the header's newline merges with what the turn writes next ("\n\n").
        head = text[: text.rindex(tags[0])]
        found = renderer.encode(head.rstrip())
        at = _last(full, found)
        if at >= 0:
            gap = len(head) - len(head.rstrip())  # the header's own newline
            after = renderer.tokenizer.decode(full[at + len(found) :])[gap:]
            rest = renderer.encode("\n" + tags[1] + "\n\n" + after)
            return rest[: next(i for i, t in enumerate(rest) if t in renderer.end_ids) + 1]
    assert at >= 0, "the generation prompt opens the assistant turn"
    rest = full[at + len(opening) :]
    end = next((i for i, t in enumerate(rest) if t in renderer.end_ids), None)
    if end is None:  # the turn ends at the next message's opener (GLM): what the model samples
        return sampled + rest + [_opener_after(renderer, [*history, answer], tools, kwargs)]
    return sampled + rest[: end + 1]


def _opener_after(
    renderer: ChatRenderer, messages: list[Message], tools: Sequence[Any], kwargs: dict[str, Any]
) -> int:
    """The stop token of a template whose assistant turns end where the next message begins:
    the opener of tool results after calls, of a user turn after an answer (the last stop token
    of the conversation with such a message after the answer)."""
    follower = _follower(messages[-1])
    after = renderer.full_prompt([*messages, follower], tools, kwargs, add_generation_prompt=False)
    return next(t for t in reversed(after) if t in renderer.end_ids)


def _follower(answer: Message) -> Message:
    """A message that may follow ``answer``: a tool result after calls, else a user turn."""
    calls = answer.tool_calls
    if calls:
        return Message(role="tool", content="ok", tool_call_id=calls[0].id)
    return Message(role="user", content="ok")


# Families whose template renders a final assistant message as the generation prompt's
# continuation (Nemotron Nano v2's: under an open <think>), not as the turn the model writes.
FINAL_TURN_PREFILLED = frozenset({"nemotron_nano_v2"})


def _last(tokens: list[int], part: list[int]) -> int:
    """Where ``part`` last occurs in ``tokens``, or -1."""
    for at in range(len(tokens) - len(part), -1, -1):
        if tokens[at : at + len(part)] == part:
            return at
    return -1


# Conversations a family's template refuses outright (its raise_exception), with why; each
# family's own test shows the refusal. vLLM serving that template refuses them too.
_GEMMA3_ALTERNATION = (
    "vLLM's Gemma 3 pythonic template refuses a user message right after tool results "
    "(its user/model alternation check skips tool turns and call turns)"
)
TEMPLATE_REFUSES = {
    ("gemma3", name): _GEMMA3_ALTERNATION
    for name in ("system-change-plain", "system-change-thinking")
}


def turns(renderer: ChatRenderer, conversation: Conversation) -> Iterator[Turn]:
    """The conversation's calls in order, each prompt built the way the ingress builds it: the
    chain continued, or rendered in full where the template cannot continue it."""
    refused = TEMPLATE_REFUSES.get((renderer.family.name, conversation.name))
    if refused is not None:
        pytest.skip(refused)
    conversation = in_family_ids(renderer.family, conversation)
    messages, tools = conversation.messages, conversation.tools
    kwargs = template_kwargs(renderer.family, conversation)
    chain: list[int] | None = None
    covered = 0
    for at, message in enumerate(messages):
        if message.role != "assistant":
            continue
        history = messages[:at]
        continuation = None
        if chain is not None:
            try:
                end = chain[-1] if chain[-1] in renderer.end_ids else None
                continuation = renderer.continuation(history, covered, end, tools, kwargs)
            except NotAppendOnly:
                moved = [d for d in renderer.family.divergences if d.endswith("_moved")]
                assert moved, "a re-render the family does not declare"
        if chain is None or continuation is None:
            prompt = renderer.full_prompt(history, tools, kwargs)
            tail = len(prompt)
        else:
            prompt, tail = chain + continuation, len(continuation)
        output = output_ids(renderer, history, message, tools, kwargs)
        yield Turn(history, message, prompt, tail, output)
        chain, covered = prompt + output, at + 1


def sent_in_order(text: str, messages: Sequence[Message]) -> bool:
    """Whether every non-empty message the scaffold sent (not the model's) is in ``text``, in
    order (system messages anywhere: a template may move them up front)."""
    at = 0
    for message in messages:
        if message.role == "assistant" or not message.content.strip():
            continue
        # As written, or as a JSON string (gpt-oss's template writes tool results so).
        forms = (message.content.strip(), json.dumps(message.content.strip())[1:-1])
        if message.role == "system":
            if not any(form in text for form in forms):
                return False
            continue
        found = [(text.find(form, at), form) for form in forms]
        hits = [(where, form) for where, form in found if where >= 0]
        if not hits:
            return False
        where, form = min(hits)
        at = where + len(form)
    return True


@pytest.mark.parametrize("conversation", CORPUS, ids=lambda c: c.name)
@pytest.mark.parametrize("name", PROVEN)
def test_tito_prompt_is_the_full_render(name: str, conversation: Conversation) -> None:
    renderer = renderer_of(name)
    family = renderer.family
    kwargs = template_kwargs(family, conversation)
    for turn in turns(renderer, conversation):
        full = renderer.full_prompt(turn.history, conversation.tools, kwargs)
        if turn.prompt == full:
            continue
        assert family.divergences, f"turn {len(turn.history)}: TITO prompt != full render"
        # Past assistant turns differ, never what the scaffold sent (a system message the
        # template does not write at all, gpt-oss's after the first, in neither).
        full_text = renderer.tokenizer.decode(full)
        shown = [m for m in turn.history if m.role != "system" or sent_in_order(full_text, [m])]
        for tokens in (turn.prompt, full):
            assert sent_in_order(renderer.tokenizer.decode(tokens), shown)
        # The seam: the continuation is the full render's tail after the last assistant turn.
        assert turn.prompt[-turn.tail :] == full[-turn.tail :]


def parse(family: Family, text: str, tools: Sequence[Any], reasoning_open: bool) -> ParsedOutput:
    options = ParserOptions(
        "step", tools=tools, parse_tools=bool(tools), reasoning_open=reasoning_open
    )
    parser = family.parser(options)
    parser.feed(text)
    return parser.finish()[1]


def generated_text(renderer: ChatRenderer, output: list[int]) -> str:
    """What the ingress gives the parser: the output without its stop token, decoded."""
    ids = output[:-1] if output and output[-1] in renderer.end_ids else output
    special = renderer.family.decode_special_tokens
    return str(renderer.tokenizer.decode(ids, skip_special_tokens=not special))


def opened_reasoning(renderer: ChatRenderer, prompt: list[int]) -> bool:
    end = renderer.tokenizer.decode(prompt[-4:], skip_special_tokens=False)
    return renderer.family.reasoning_open(str(end))


def arguments(call: ToolCall) -> Any:
    return json.loads(call.arguments)


# Templates that write every argument as text (Llama 4's pythonic one: k="%s", the value as
# Jinja formats it), so a call does not read back as given: the parser reads what was written
# (each value the text written, as Python reads the string) or refuses it with parse_error (a
# newline or quote inside a value), never a silently changed call. Gemma 3's pythonic one
# writes JSON values but no comma between arguments: the parser reads a one-argument call as
# given and refuses the rest with parse_error.
ARGUMENTS_AS_TEXT = frozenset({"llama4", "gemma3"})


def as_written(call: ToolCall) -> tuple[str, Any]:
    """``call`` as a template in ``ARGUMENTS_AS_TEXT`` writes it: each value as ``"%s"``."""
    return call.name, {k: str(v) for k, v in arguments(call).items()}


@pytest.mark.parametrize("conversation", CORPUS, ids=lambda c: c.name)
@pytest.mark.parametrize("name", PROVEN)
def test_parser_reads_back_what_the_template_renders(name: str, conversation: Conversation) -> None:
    renderer = renderer_of(name)
    family, tools = renderer.family, conversation.tools
    kwargs = template_kwargs(family, conversation)
    for turn in turns(renderer, conversation):
        text = generated_text(renderer, turn.output)
        parsed = parse(family, text, tools, opened_reasoning(renderer, turn.prompt))
        where = f"turn {len(turn.history)}: {text!r}"
        if name in ARGUMENTS_AS_TEXT and turn.answer.tool_calls:
            if parsed.parse_error is not None:
                assert parsed.tool_calls == [] and parsed.content == text, where
                continue
            assert [as_written(c) for c in parsed.tool_calls] == [
                as_written(c) for c in turn.answer.tool_calls
            ], where
        else:
            assert parsed.parse_error is None, where
            assert [(c.name, arguments(c)) for c in parsed.tool_calls] == [
                (c.name, arguments(c)) for c in turn.answer.tool_calls
            ], where
        assert parsed.content.strip() == turn.answer.content.strip(), where
        if turn.answer.reasoning and turn.answer.reasoning.strip() in text:
            assert (parsed.reasoning or "").strip() == turn.answer.reasoning.strip(), where
        # Rendered back (with the ids the client echoes), the same tokens.
        calls = tuple(
            ToolCall(id=original.id, name=call.name, arguments=call.arguments)
            for original, call in zip(turn.answer.tool_calls, parsed.tool_calls, strict=True)
        )
        again = Message(
            role="assistant", content=parsed.content, reasoning=parsed.reasoning, tool_calls=calls
        )
        assert output_ids(renderer, turn.history, again, tools, kwargs) == turn.output, where


@pytest.mark.parametrize("name", PROVEN)
def test_streaming_and_whole_parsing_agree_on_every_split(name: str) -> None:
    renderer = renderer_of(name)
    family = renderer.family
    checked = 0
    for conversation in CORPUS[1:4]:
        for turn in turns(renderer, conversation):
            text = generated_text(renderer, turn.output)
            opened = opened_reasoning(renderer, turn.prompt)
            whole = parse(family, text, conversation.tools, opened)
            for cut in range(len(text) + 1):
                parser = family.parser(
                    ParserOptions("step", tools=conversation.tools, reasoning_open=opened)
                )
                parser.feed(text[:cut])
                parser.feed(text[cut:])
                assert parser.finish()[1] == whole, (cut, text)
            checked += 1
    assert checked >= 5


@pytest.mark.parametrize("name", PROVEN)
def test_a_call_cut_off_is_text_with_a_parse_error(name: str) -> None:
    renderer = renderer_of(name)
    family = renderer.family
    cut_calls = 0
    for conversation in CORPUS:
        for turn in turns(renderer, conversation):
            text = generated_text(renderer, turn.output)
            if PROBE not in text:
                continue
            cut = text[: text.index(PROBE) + 3]
            opened = opened_reasoning(renderer, turn.prompt)
            parsed = parse(family, cut, conversation.tools, opened)
            assert parsed.parse_error is not None, cut
            assert PROBE[:3] in parsed.content, "the malformed call is returned as text"
            assert not any(PROBE[:3] in c.arguments for c in parsed.tool_calls)
            cut_calls += 1
    assert cut_calls > 0


# Families whose models open calls before closing their reasoning, and whose parsers read such a
# call as the reasoning's end, as vLLM's reasoning parsers for them do.
CALL_ENDS_REASONING = frozenset({"qwen3", "qwen35", "nemotron3", "glm45", "minimax_m2", "seed_oss"})


@pytest.mark.parametrize("name", PROVEN)
def test_a_call_inside_reasoning_is_not_a_call(name: str) -> None:
    """Except where the call ends the reasoning (``CALL_ENDS_REASONING``): then it is a call."""
    renderer = renderer_of(name)
    family = renderer.family
    if family.reasoning_tags is None:
        pytest.skip(f"{name} has no reasoning block")
    conversation = in_family_ids(family, next(c for c in CORPUS if c.name == "tools-thinking"))
    kwargs = template_kwargs(family, conversation)
    checked = 0
    for turn in turns(renderer, conversation):
        if not turn.answer.tool_calls:
            continue
        plain = turn.answer.model_copy(update={"reasoning": None, "content": ""})
        call_text = generated_text(
            renderer, output_ids(renderer, turn.history, plain, conversation.tools, kwargs)
        )
        # The call alone: a reasoning block's closing tag inside reasoning would end it.
        call_text = call_text.split(family.reasoning_tags[1])[-1].strip()
        thinking = Message(role="assistant", content="Done.", reasoning=f"Maybe {call_text}")
        output = output_ids(renderer, turn.history, thinking, conversation.tools, kwargs)
        text = generated_text(renderer, output)
        parsed = parse(family, text, conversation.tools, opened_reasoning(renderer, turn.prompt))
        if name in CALL_ENDS_REASONING:
            calls = [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
            assert calls == [(c.name, json.loads(c.arguments)) for c in turn.answer.tool_calls]
            assert parsed.parse_error is None and (parsed.reasoning or "").strip() == "Maybe"
        else:
            assert parsed.tool_calls == [], text
        assert parsed.content.strip() == "Done."
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("conversation", CORPUS, ids=lambda c: c.name)
@pytest.mark.parametrize("name", PROVEN)
def test_the_worker_finds_every_generated_turn(name: str, conversation: Conversation) -> None:
    """The rebuild's assistant spans (what a rebuilt segment trains on) end where each
    generated turn ends and start where it starts, or a few tokens before: at the template's
    assistant opening, when the generation prompt decorates it further (Qwen3's empty
    ``<think></think>`` with thinking off, DeepSeek's ``<think>``)."""
    renderer = renderer_of(name)
    rebuilder = Rebuilder(renderer)
    for turn in turns(renderer, conversation):
        chain = turn.prompt + turn.output
        spans = rebuilder.assistant_spans(chain)
        where = f"turn {len(turn.history)}: {renderer.tokenizer.decode(chain[-40:])!r}"
        assert spans and spans[-1][1] == len(chain), where
        assert len(turn.prompt) - GENERATION_DECORATION <= spans[-1][0] <= len(turn.prompt), where

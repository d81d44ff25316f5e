"""The family corpus proof's shared steps (tests/titoflow/tito/test_family_corpus.py, each
family's own tests, the template and oracle parity tests): the families proven, the corpus, each
conversation as a family writes it (:func:`in_family_ids`), its model calls with each prompt built
as the ingress builds it (:func:`turns`), what the model generates for each (:func:`output_ids`,
:func:`generated_text`) and what the family's parser reads back (:func:`parse`); and a value with
its keys written in another order (:func:`reordered`: the same tools, another text to render).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from cli.dev.tokenizers import SOURCES
from tests.support.corpus import Conversation, corpus, expressible
from tests.support.families import family_tokenizer
from titoflow.errors import NotAppendOnly
from titoflow.tito.families import FAMILIES, family_named
from titoflow.tito.families.base import Family, ParserOptions
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput
from titoflow.tito.render import ChatRenderer

PROVEN = sorted(f.name for f in FAMILIES if f.name in SOURCES)
CORPUS = corpus()
# The template switch that turns a family's reasoning on or off, where it has one.
THINKING_SWITCH = {
    "qwen3": "enable_thinking",
    "qwen35": "enable_thinking",
    "nemotron3": "enable_thinking",
    "glm45": "enable_thinking",
    "deepseek_v3": "thinking",
    "deepseek_v32": "enable_thinking",
    "deepseek_v4": "enable_thinking",
    "gemma4": "enable_thinking",
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
    if at < 0 and tags and renderer.family.reasoning_open(text) and text.startswith(tags[0]):
        # A generation prompt that is the opening tag alone (Gemma 4's after tool results) and
        # a turn the template writes without a block: the model closed it at once.
        assert full[: len(bare)] == bare, "the turn follows the history"
        rest = renderer.encode(tags[1]) + full[len(bare) :]
        return rest[: next(i for i, t in enumerate(rest) if t in renderer.end_ids) + 1]
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


def parse(family: Family, text: str, tools: Sequence[Any], reasoning_open: bool) -> ParsedOutput:
    options = ParserOptions(
        "step", tools=tools, parse_tools=bool(tools), reasoning_open=reasoning_open
    )
    parser = family.parser(options)
    parser.feed(text)
    return parser.finish()[1]


def echoed(parsed: ParsedOutput, answer: Message) -> Message:
    """The parsed turn as a client sends it back: its content, reasoning and calls, each call
    with the id of the ``answer``'s call it parses to (the ids the template renders)."""
    calls = tuple(
        ToolCall(id=original.id, name=call.name, arguments=call.arguments)
        for original, call in zip(answer.tool_calls, parsed.tool_calls, strict=True)
    )
    return Message(
        role="assistant", content=parsed.content, reasoning=parsed.reasoning, tool_calls=calls
    )


def generated_text(renderer: ChatRenderer, output: list[int]) -> str:
    """What the ingress gives the parser: the output without its stop token, decoded."""
    ids = output[:-1] if output and output[-1] in renderer.end_ids else output
    special = renderer.family.decode_special_tokens
    return str(renderer.tokenizer.decode(ids, skip_special_tokens=not special))


def opened_reasoning(renderer: ChatRenderer, prompt: list[int]) -> bool:
    end = renderer.tokenizer.decode(prompt[-4:], skip_special_tokens=False)
    return renderer.family.reasoning_open(str(end))


def reordered(value: Any) -> Any:
    """``value`` with every object's keys in reverse order: equal, but written apart."""
    if isinstance(value, dict):
        return {key: reordered(value[key]) for key in reversed(value)}
    if isinstance(value, list | tuple):
        return type(value)(reordered(item) for item in value)
    return value

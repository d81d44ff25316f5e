"""Every registered model family, proven on the shared corpus (tests/support/corpus.py) with
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
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.corpus import PROBE, Conversation
from tests.support.family_corpus import (
    CORPUS,
    PROVEN,
    echoed,
    generated_text,
    in_family_ids,
    opened_reasoning,
    output_ids,
    parse,
    renderer_of,
    template_kwargs,
    turns,
)
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.messages import Message, ToolCall
from workers.rebuild import Rebuilder

# Tokens a generation prompt may add after the template's assistant opening.
GENERATION_DECORATION = 6


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
        again = echoed(parsed, turn.answer)
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
CALL_ENDS_REASONING = frozenset(
    {
        "qwen3",
        "qwen35",
        "nemotron3",
        "glm45",
        "minimax_m2",
        "seed_oss",
        "gemma4",
        "magistral",
        "magistral_v13",
        "deepseek_v4",
    }
)


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

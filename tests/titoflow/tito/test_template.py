"""The renderer's template (titoflow/tito/template.py) writes exactly what transformers'
``apply_chat_template`` writes, for every family, on generated conversations, tool lists (none,
the corpus's, Claude Code's 24 tools and 64 KB) and switches, with its tool lists kept across
calls; and TITO under Claude Code's tool list is the full render as transformers writes it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.harness import claude_code_tools
from tests.support.corpus import TOOLS, corpus
from tests.support.family_corpus import (
    PROVEN,
    THINKING_SWITCH,
    in_family_ids,
    renderer_of,
    reordered,
    template_kwargs,
    turns,
)
from titoflow.errors import TemplateError
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer

TOOL_LISTS: tuple[tuple[dict[str, Any], ...], ...] = (
    (),
    TOOLS,
    reordered(TOOLS),  # the same tools to compare, another text to render
    TOOLS[:2],
    claude_code_tools(),
)
CORPUS = corpus()


def transformers_text(
    renderer: ChatRenderer,
    messages: tuple[Message, ...],
    tools: tuple[dict[str, Any], ...],
    kwargs: dict[str, Any],
    add_generation_prompt: bool,
) -> str:
    family = renderer.family
    dicts = [m.template_dict(family.tool_arguments_text, family.reasoning_key) for m in messages]
    text = renderer.tokenizer.apply_chat_template(
        dicts,
        tools=list(tools) or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **kwargs,
    )
    return str(text)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(PROVEN),
    conversation=st.sampled_from(CORPUS),
    cut=st.integers(min_value=1, max_value=60),
    tools=st.sampled_from(TOOL_LISTS),
    thinking=st.booleans(),
    add_generation_prompt=st.booleans(),
)
def test_render_is_what_transformers_renders(
    name: str,
    conversation: Any,
    cut: int,
    tools: tuple[dict[str, Any], ...],
    thinking: bool,
    add_generation_prompt: bool,
) -> None:
    renderer = renderer_of(name)  # one per family: tool lists stay kept across examples
    messages = in_family_ids(renderer.family, conversation).messages[:cut]
    switch = THINKING_SWITCH.get(name)
    kwargs = {switch: thinking} if switch else {}
    try:
        expected = transformers_text(renderer, messages, tools, kwargs, add_generation_prompt)
    except Exception:
        with pytest.raises(TemplateError):
            renderer.render_text(messages, tools, kwargs, add_generation_prompt)
        return
    for _ in range(2):  # the first call may keep the tool list, the second reads it kept
        assert renderer.render_text(messages, tools, kwargs, add_generation_prompt) == expected


def test_tool_lists_that_differ_in_key_order_render_apart() -> None:
    renderer = renderer_of("qwen3")
    messages = CORPUS[0].messages[:2]
    for tools in (TOOLS, reordered(TOOLS), TOOLS):
        expected = transformers_text(renderer, messages, tools, {}, True)
        assert renderer.render_text(messages, tools, {}, True) == expected
    assert expected != transformers_text(renderer, messages, reordered(TOOLS), {}, True)


def test_a_switch_named_like_a_parameter_is_transformers_own_call() -> None:
    """A template switch that collides with apply_chat_template's parameters is not passed to
    the template by the shortcut: the call is transformers' own, whatever it makes of it."""
    renderer = renderer_of("qwen3")
    messages = CORPUS[0].messages[:2]
    kwargs = {"continue_final_message": True}
    expected = transformers_text(renderer, messages, TOOLS, kwargs, False)
    assert renderer.render_text(messages, TOOLS, kwargs, False) == expected


@pytest.mark.parametrize("name", PROVEN)
def test_tito_under_claude_codes_tools_is_transformers_full_render(name: str) -> None:
    """Every turn of an agent loop with parallel calls and reasoning, under Claude Code's 64 KB
    tool list:
    the chain plus the continuation (its tools rendered from the kept list) is transformers'
    full render, tokenized, wherever the family declares no divergence."""
    renderer = renderer_of(name)
    conversation = next(c for c in CORPUS if c.name == "parallel-thinking")
    conversation = type(conversation)(
        conversation.name, conversation.messages, claude_code_tools(), conversation.thinking
    )
    kwargs = template_kwargs(renderer.family, conversation)
    continued = 0
    for turn in turns(renderer, conversation):
        text = transformers_text(renderer, turn.history, conversation.tools, kwargs, True)
        full = renderer.encode(text)
        if renderer.family.divergences:
            assert turn.prompt[-turn.tail :] == full[-turn.tail :]
        else:
            assert turn.prompt == full
        continued += turn.tail < len(turn.prompt)
    assert continued == 5  # every turn after the first

"""DeepSeek-V4: V3.2's DSML calls in a ``tool_calls`` block, on V4's vocabulary, where
``｜DSML｜`` is one token; reasoning in ``<think>…</think>``, opened by the prompt in thinking
mode (the default); tool results written into a user turn::

    <｜User｜>question<｜Assistant｜><think>reasoning</think>content

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="K" string="true">raw text</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>…</tool_result><｜Assistant｜><think>

The parser reads a block as V3.2's does (``deepseek_v32``: each value raw or JSON as its
``string`` attribute says; what vLLM would guess refused with ``parse_error``), but a block
opened inside the reasoning ends it, as vLLM's ``deepseek_v4`` parser reads it.

The request's tools are written into the first system message, or into an empty one put
first where there is none; a system message a later request adds after the first turns takes
them there (``tools_moved``: that turn is rendered in full).

History: with tools in the request the template writes every turn back as sampled. Without
tools, in thinking mode, it writes an assistant turn's reasoning only after the last user
message (``reasoning_dropped``), and the ``<think>`` that opened the model's turn becomes
``</think>`` once a user message follows (``thinking_opener_moved``): that turn is rendered in
full, a new chain, as DeepSeek's encoder writes it too. The template is titoflow's
(cli/dev/tokenizers/deepseek_v4.py), held to DeepSeek's encoder as vLLM's ``deepseek_v4``
tokenizer mode runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import Family, Function, Grammar, ParserOptions, TokenLookup
from titoflow.tito.families.deepseek_v32 import (
    DSML,
    INVOKE_CLOSE,
    INVOKE_OPEN,
    invoke_grammar,
    parse_block,
)
from titoflow.tito.families.tagged import TaggedParser, Tags
from titoflow.tito.output import OutputParser

CALLS_OPEN = f"<{DSML}tool_calls>"
CALLS_CLOSE = f"</{DSML}tool_calls>"
# An <｜DSML｜invoke> written without its block is a call too (vLLM's parser reads it as one).
TAGS = Tags(
    call_open=CALLS_OPEN, call_close=CALLS_CLOSE, bare_open=INVOKE_OPEN, bare_close=INVOKE_CLOSE
)


def _parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(options, parse_block, TAGS, implicit_close=True, call_ends_reasoning=True)


def _marked(text: str, token_id: TokenLookup) -> list[dict[str, Any]]:
    """``text`` with each ``｜DSML｜`` in it as its token, the rest as text."""
    head, *tails = text.split(DSML)
    elements = [g.text(head)] if head else []
    for tail in tails:
        elements.append(g.literal(DSML, token_id))
        if tail:
            elements.append(g.text(tail))
    return elements


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    return invoke_grammar(functions, lambda text: _marked(text, token_id))


def _is_deepseek_v4(template: str) -> bool:
    return "<｜Assistant｜>" in template and CALLS_OPEN in template


DEEPSEEK_V4 = Family(
    name="deepseek_v4",
    summary='DeepSeek-V4: <｜DSML｜tool_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter '
    'name="K" string="true|false"> calls, <think> opened by the prompt unless thinking is off',
    detect=_is_deepseek_v4,
    parser=_parser,
    grammar=Grammar(
        call=_call,
        separator="",  # each invoke opens with its own newline
        prefix=lambda token_id: _marked("\n\n" + CALLS_OPEN, token_id),
        suffix=lambda token_id: _marked("\n" + CALLS_CLOSE, token_id),
    ),
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=(
        "without tools in the request, in thinking mode: writes an assistant turn's reasoning "
        "only after the last user message, and a new user message turns the <think> that ended "
        "the previous user turn into </think>; a conversation with no system message first "
        "has the tools moved into the first system message it gets"
    ),
    # The model's turn follows <｜Assistant｜><think> (or </think>), after a user turn or the
    # tool results, which are a user turn.
    assistant_starts=("<｜Assistant｜>",),
    divergences=("reasoning_dropped", "thinking_opener_moved", "tools_moved"),
    tools_stand_in=True,
)

"""DeepSeek-V3.2: DeepSeek-V3's turns and vocabulary, reasoning in ``<think>…</think>`` opened by
the prompt in thinking mode, and each turn's calls as one DSML block after the content::

    content

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="K" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="N" string="false">{"JSON": 1}</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls><｜end▁of▁sentence｜>

``string="true"`` marks a value written raw (a string), ``string="false"`` one written as JSON
(everything else). The markers are plain text in the vocabulary, not tokens.

The parser reads a block as vLLM's ``deepseek_v32`` tool parser does: an ``<｜DSML｜invoke>``
written without the block is a call, a block or an invoke the output ends inside is closed there,
a value whose ``</｜DSML｜parameter>`` was skipped ends at the next parameter. What vLLM would
guess is refused with ``parse_error`` instead: a ``string="false"`` value that is not JSON, a
parameter without its ``string`` attribute, one given twice, a value whose end is unknown, text
between parameters or calls. Reasoning ends at ``</think>`` only (vLLM serves V3.2 with the
``deepseek_v3`` reasoning parser): a block opened inside the reasoning is reasoning.

History: the template writes an assistant turn's reasoning only in thinking mode and only after
the last user message (``reasoning_dropped``), and a system message after the first nowhere. In
thinking mode the ``<think>`` that opens the model's turn ends the last user turn (or the tool
results after it), and every earlier user turn ends ``</think>`` instead: a new user message
rewrites the previous one's ending (``thinking_opener_moved``), so that turn is rendered in full,
a new chain, as DeepSeek's encoder writes it too. The template served is llama.cpp's port with
pinned edits (cli/dev/tokenizers/deepseek_v32.py): no generation prompt (the user turn and the
tool results write the assistant's opening, as DeepSeek's encoder does), thinking off by default
(as vLLM's ``deepseek_v32`` tokenizer mode), and the tool block as DeepSeek's encoder writes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import (
    Family,
    Function,
    Grammar,
    MalformedCall,
    ParserOptions,
    TokenLookup,
)
from titoflow.tito.families.tagged import TaggedParser, Tags
from titoflow.tito.output import OutputParser

DSML = "｜DSML｜"
CALLS_OPEN = f"<{DSML}function_calls>"
CALLS_CLOSE = f"</{DSML}function_calls>"
INVOKE_OPEN = f"<{DSML}invoke name="
INVOKE_CLOSE = f"</{DSML}invoke>"
PARAMETER_OPEN = f"<{DSML}parameter name="
PARAMETER_CLOSE = f"</{DSML}parameter>"
# An <｜DSML｜invoke> written without its block is a call too (vLLM's parser reads it as one).
TAGS = Tags(
    call_open=CALLS_OPEN, call_close=CALLS_CLOSE, bare_open=INVOKE_OPEN, bare_close=INVOKE_CLOSE
)
_INVOKE = re.compile(r"\s*" + re.escape(INVOKE_OPEN) + r'"([^"]*)">')
_PARAMETER = re.compile(
    r"\s*" + re.escape(PARAMETER_OPEN) + r'"([^"]+)"(?:\s+string="([^"]*)")?\s*>'
)


def _value(raw: str, string: str | None, key: str) -> Any:
    """A value as its ``string`` attribute says it is written."""
    if string == "true":
        return raw
    if string != "false":
        raise MalformedCall(f'parameter {key!r}: string={string!r}, not "true" or "false"')
    try:
        return json.loads(raw)
    except ValueError:
        raise MalformedCall(
            f'parameter {key!r}: string="false" but not JSON: {raw[:40]!r}'
        ) from None


def _value_end(body: str, start: int, key: str) -> tuple[int, int]:
    """(end of the value starting at ``start``, where reading resumes): its closer, or the next
    parameter's opening where the closer was skipped; one running into the invoke's closer or
    the block's end has no known end."""
    found = {
        marker: at
        for marker in (PARAMETER_CLOSE, PARAMETER_OPEN, INVOKE_CLOSE)
        if (at := body.find(marker, start)) >= 0
    }
    first = min(found, key=found.__getitem__) if found else None
    if first == PARAMETER_CLOSE:
        return found[first], found[first] + len(PARAMETER_CLOSE)
    if first == PARAMETER_OPEN:
        return found[first], found[first]
    raise MalformedCall(f"parameter {key!r} not closed")


def _invoke(inner: str, at: int) -> tuple[str, dict[str, Any], int]:
    opening = _INVOKE.match(inner, at)
    if opening is None:
        raise MalformedCall(f'expected {INVOKE_OPEN}"NAME">: {inner[at:].strip()[:40]!r}')
    name, at = opening.group(1), opening.end()
    if not name:
        raise MalformedCall("an invoke without a name")
    arguments: dict[str, Any] = {}
    while parameter := _PARAMETER.match(inner, at):
        key = parameter.group(1)
        if key in arguments:
            raise MalformedCall(f"parameter {key!r} given twice")
        end, at = _value_end(inner, parameter.end(), key)
        arguments[key] = _value(inner[parameter.end() : end], parameter.group(2), key)
    rest = inner[at:].lstrip()
    if rest.startswith(INVOKE_CLOSE):
        return name, arguments, len(inner) - len(rest) + len(INVOKE_CLOSE)
    if rest:
        raise MalformedCall(f"unexpected text in invoke {name!r}: {rest[:40]!r}")
    return name, arguments, len(inner)


def parse_block(inner: str) -> list[tuple[str, Any]]:
    """The calls of one block (or of one bare ``<｜DSML｜invoke>``), the last closer possibly
    missing; whitespace between them tolerated, anything else refused."""
    calls: list[tuple[str, Any]] = []
    at = 0
    while inner[at:].strip():
        name, arguments, at = _invoke(inner, at)
        calls.append((name, arguments))
    if not calls:
        raise MalformedCall(f"an empty {CALLS_OPEN} block")
    return calls


def _parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(options, parse_block, TAGS, implicit_close=True)


def invoke_grammar(
    functions: Sequence[Function], write: Callable[[str], list[dict[str, Any]]]
) -> dict[str, Any]:
    """``\\n<｜DSML｜invoke name="NAME">\\n`` + parameters + ``\\n</｜DSML｜invoke>``: xgrammar's
    ``deepseek_xml`` arguments (each value raw or JSON, as its ``string`` attribute says); the
    markers as ``write`` gives them (V3.2: text; V4: ``｜DSML｜`` by its id)."""
    return g.any_call(
        functions,
        f'{INVOKE_OPEN}"NAME">',
        '<>"',
        lambda name, parameters: [
            *write(f'\n{INVOKE_OPEN}"{name}">\n'),
            g.arguments(parameters, "deepseek_xml"),
            *write(INVOKE_CLOSE),
        ],
    )


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    return invoke_grammar(functions, lambda text: [g.text(text)])


def _is_deepseek_v32(template: str) -> bool:
    # Its block is function_calls; DeepSeek-V4's DSML block is tool_calls.
    return "<｜Assistant｜>" in template and DSML in template and "function_calls" in template


DEEPSEEK_V32 = Family(
    name="deepseek_v32",
    summary='DeepSeek-V3.2: <｜DSML｜function_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter '
    'name="K" string="true|false"> calls, <think> opened by the template\'s enable_thinking',
    detect=_is_deepseek_v32,
    parser=_parser,
    grammar=Grammar(
        call=_call,
        separator="",  # each invoke opens with its own newline
        prefix=lambda token_id: [g.text("\n\n" + CALLS_OPEN)],
        suffix=lambda token_id: [g.text("\n" + CALLS_CLOSE)],
    ),
    decode_special_tokens=False,
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=(
        "writes an assistant turn's reasoning only with enable_thinking and only after the last "
        "user message; writes a system message after the first nowhere; with enable_thinking a "
        "new user message turns the <think> that ended the previous user turn into </think>"
    ),
    # The model's turn follows the user turn's <｜Assistant｜><think> (or </think>), or the tool
    # results' "</function_results>\n\n<think>" (or </think>).
    assistant_starts=("<｜Assistant｜>", "</function_results>\n\n"),
    divergences=("reasoning_dropped", "thinking_opener_moved"),
    tools_stand_in=True,
)

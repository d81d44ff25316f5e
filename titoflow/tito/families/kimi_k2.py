"""Kimi K2 (K2-Instruct-0905, K2-Thinking, K2.5): roles ``<|im_system|>`` / ``<|im_user|>`` /
``<|im_assistant|>`` NAME ``<|im_middle|>`` ... ``<|im_end|>``, reasoning in ``<think>``, and
the turn's calls in one section::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
    {JSON}<|tool_call_end|>...<|tool_calls_section_end|>

Every marker is a special token of Kimi's vocabulary, so the parser reads text decoded with
special tokens kept.

The call id is part of the format: the template writes ``tool_call['id']`` verbatim into the
call and into the result (``## Return of ID``), and the model numbers its calls itself
(``IDX`` counts calls over the conversation). So the parser returns the model's own id, not
:func:`~titoflow.tito.families.base.tool_call_id`: the client echoes it, the template renders the
call and its result with the very text the model sampled, and the TITO continuation of a tool
result is the full render's, token for token. A synthetic id would be rendered into every past
call (each tool turn diverging from the chain) and the model would read results for ids it never
wrote. The id is still deterministic: a replayed step has the same text, hence the same ids.

K2-Thinking and K2.5 often open the call section before closing their reasoning
(``<think>R<|tool_calls_section_begin|>...``, the ``</think>`` late or never): the section
marker ends the reasoning, as in vLLM's Kimi reasoning parser, and the late ``</think>``, the
reasoning block's own closer, is dropped rather than shown as text. A section the output ends
inside (no ``<|tool_calls_section_end|>``) is read as if closed there: complete calls are
calls, a call cut off is a failure.

Invariants: streaming and whole parsing are one code path, so every chunking gives the same
message. Reasoning, and text outside reasoning and call sections, are returned exactly as
generated (the template writes no layout around them; only whitespace before the opening
``<think>`` and a late ``</think>`` are dropped), so a parsed turn renders back to the text it
came from. A section that does not parse is returned as text exactly as generated, with
``parse_error`` naming the first failure: a call-shaped output is never lost silently.

The template drops the reasoning of every assistant turn up to the last one without tool calls
(``<think></think>``): a tool loop is append-only until the turn that answers without a call.

K2.5/K2.6's tokenizer code passes its template ``tools_ts_str``, the tools as TypeScript
declarations, which the template writes instead of their JSON: the family passes the same
(:mod:`titoflow.tito.families.kimi_tools`), so the prompt is the one a real K2.5/K2.6
directory renders.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum, auto
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import (
    Family,
    Function,
    Grammar,
    MalformedCall,
    ParserOptions,
    TokenLookup,
    parse_json_object,
)
from titoflow.tito.families.incremental import IncrementalParser, partial_marker
from titoflow.tito.families.kimi_tools import tools_ts_str
from titoflow.tito.output import (
    OutputParser,
    ReasoningDelta,
    TextDelta,
)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

# ``functions.NAME:IDX``; NAME is everything up to the last ``:IDX`` (MCP names hold dots and
# colons), but no marker: a stray <|tool_call_begin|> must not hide inside a name.
_CALL_ID = re.compile(r"functions\.([^\s<>]+):(\d+)")
# The index a forced call may carry: the model's own count, without leading zeros.
_INDEX_PATTERN = "0|[1-9][0-9]{0,3}"


def call_id(name: str, index: int) -> str:
    """The id a Kimi model writes for its ``index``-th call (over the conversation) of ``name``:
    the only ids the parser accepts, so the only ones a Kimi conversation's history holds."""
    return f"functions.{name}:{index}"


def parse_section(inner: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(id, name, arguments) of each call between the section markers, or MalformedCall.

    Whitespace between calls is allowed (it decides nothing); any other text is not. The last
    call's ``<|tool_call_end|>`` may be missing: the section's end closes it (as vLLM reads it).
    """
    calls: list[tuple[str, str, dict[str, Any]]] = []
    at = 0
    while inner[at:].strip():
        start = inner.find(CALL_BEGIN, at)
        if start < 0 or inner[at:start].strip():
            raise MalformedCall(f"call {len(calls)}: expected {CALL_BEGIN}")
        head = start + len(CALL_BEGIN)
        middle = inner.find(ARGUMENT_BEGIN, head)
        end = inner.find(CALL_END, head)
        if end < 0 and middle >= 0 and inner.find(CALL_BEGIN, middle) < 0:
            end = len(inner)  # the last call, closed by the section's end
        if middle < 0 or end < 0 or end < middle:
            raise MalformedCall(f"call {len(calls)}: expected id{ARGUMENT_BEGIN}args{CALL_END}")
        call_id = inner[head:middle].strip()
        matched = _CALL_ID.fullmatch(call_id)
        if matched is None:
            raise MalformedCall(f"call {len(calls)}: id {call_id[:40]!r} is not functions.NAME:IDX")
        raw = inner[middle + len(ARGUMENT_BEGIN) : end]
        arguments = parse_json_object(
            raw, "arguments are not a JSON object", f"call {len(calls)}: "
        )
        calls.append((call_id, matched.group(1), arguments))
        at = end + len(CALL_END)
    if not calls:
        raise MalformedCall("no call in the section")
    return calls


class _State(Enum):
    START = auto()  # the output may still open a reasoning block
    REASONING = auto()
    CONTENT = auto()
    SECTION = auto()  # inside a call section, buffered until it closes


class KimiParser(IncrementalParser):
    """Reasoning in ``<think>``, then content with call sections; see the module docstring.

    Each state consumes what it can decide from ``_buf`` and keeps the rest (a marker's possible
    beginning), so the deltas depend only on the text so far, never on the chunking.
    """

    def __init__(self, options: ParserOptions) -> None:
        super().__init__(options)
        self._state = _State.REASONING if options.reasoning_open else _State.START
        self._scanned = 0  # in SECTION, where the closing marker could still start in _buf
        self._sections = 0  # sections seen, parsed or not
        # A section ended the reasoning before its </think>: that closer may still come.
        self._late_close = False

    def _advance(self, final: bool) -> None:
        super()._advance(final)
        # A call written outside any section is not parsed: never a silently lost call.
        if final and self._parse_tools and CALL_BEGIN in "".join(self._content):
            self._fail(self._sections, f"{CALL_BEGIN} outside a call section")

    def _step(self, final: bool) -> bool:
        """Advance as far as the buffer allows; True if the state changed (step again)."""
        match self._state:
            case _State.START:
                return self._start(final)
            case _State.REASONING:
                return self._reason(final)
            case _State.CONTENT:
                return self._text_or_section(final)
            case _State.SECTION:
                return self._section(final)

    def _start(self, final: bool) -> bool:
        opened = self._open_reasoning(THINK_OPEN, final)
        if opened is None:
            return False
        self._state = _State.REASONING if opened else _State.CONTENT
        return True

    def _markers(self, *markers: str) -> list[str]:
        """``markers``, with the section's opening when calls are parsed."""
        return [*markers, SECTION_BEGIN] if self._parse_tools else list(markers)

    def _first(self, markers: list[str]) -> tuple[int, str]:
        """Where the first of ``markers`` starts in ``_buf``, and which; (-1, "") if none."""
        found = [(at, m) for m in markers if (at := self._buf.find(m)) >= 0]
        return min(found) if found else (-1, "")

    def _reason(self, final: bool) -> bool:
        # The section's opening ends the reasoning too (K2-Thinking/K2.5 open it before </think>).
        markers = self._markers(THINK_CLOSE)
        at, marker = self._first(markers)
        if marker == THINK_CLOSE:
            self._emit(self._buf[:at], reasoning=True)
            self._buf = self._buf[at + len(THINK_CLOSE) :]
            self._state = _State.CONTENT
            return True
        if marker == SECTION_BEGIN:
            self._emit(self._buf[:at], reasoning=True)
            self._late_close = True
            return self._open_section(at)
        held = 0 if final else partial_marker(self._buf, markers)
        self._emit(self._buf[: len(self._buf) - held], reasoning=True)
        self._buf = self._buf[len(self._buf) - held :]
        return False

    def _text_or_section(self, final: bool) -> bool:
        markers = self._markers(THINK_CLOSE) if self._late_close else self._markers()
        at, marker = self._first(markers) if markers else (-1, "")
        if marker == THINK_CLOSE:  # the reasoning block's own closer, come after its section
            self._emit(self._buf[:at], reasoning=False)
            self._buf = self._buf[at + len(THINK_CLOSE) :]
            self._late_close = False
            return True
        if marker == SECTION_BEGIN:
            self._emit(self._buf[:at], reasoning=False)
            return self._open_section(at)
        held = partial_marker(self._buf, markers) if markers and not final else 0
        self._emit(self._buf[: len(self._buf) - held], reasoning=False)
        self._buf = self._buf[len(self._buf) - held :]
        return False

    def _open_section(self, at: int) -> bool:
        self._buf = self._buf[at:]
        self._scanned = len(SECTION_BEGIN)
        self._state = _State.SECTION
        return True

    def _section(self, final: bool) -> bool:
        end = self._buf.find(SECTION_END, self._scanned)
        if end >= 0:
            section = self._buf[: end + len(SECTION_END)]
            self._buf = self._buf[len(section) :]
            self._close(section)
            self._state = _State.CONTENT
            return True
        if final:  # the output ended inside the section: read it as closed there
            section, self._buf = self._buf, ""
            self._close(section, closed=False)
            self._state = _State.CONTENT
            return False
        # Sections can be long; do not rescan what cannot hold the closing marker.
        self._scanned = max(self._scanned, len(self._buf) - len(SECTION_END) + 1)
        return False

    def _close(self, section: str, closed: bool = True) -> None:
        number = self._sections
        self._sections += 1
        inner = section[len(SECTION_BEGIN) : len(section) - (len(SECTION_END) if closed else 0)]
        tail = ""
        try:
            try:
                calls = parse_section(inner)
            except MalformedCall:
                if closed or CALL_END not in inner:
                    raise
                # The output ended inside a call: the calls before it are whole, the cut one is
                # text with the parse error.
                whole = inner.rindex(CALL_END) + len(CALL_END)
                calls, tail = parse_section(inner[:whole]), inner[whole:]
                self._fail(number, f"not closed, and cut off after call {len(calls) - 1}")
        except MalformedCall as exc:
            self._fail(number, str(exc) if closed else f"not closed, and {exc}")
            self._emit(section, reasoning=False)
            return
        self._emit(tail, reasoning=False)
        for call_id, name, arguments in calls:
            self._add_call(name, arguments, call_id)

    def _emit(self, text: str, reasoning: bool) -> None:
        if not text:
            return
        if reasoning:
            self._reasoning.append(text)
            self._out.append(ReasoningDelta(text))
        else:
            self._content.append(text)
            self._out.append(TextDelta(text))

    def _fail(self, number: int, why: str) -> None:
        if self._error is None:  # the first failure is the turn's parse error
            self._error = f"{SECTION_BEGIN} block {number}: {why}"


def _parser(options: ParserOptions) -> OutputParser:
    return KimiParser(options)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>``

    IDX is the model's own count of calls in the conversation, which the grammar cannot know:
    any short number is admitted.
    """
    calls = g.any_call(
        functions,
        "functions.NAME:IDX",
        "",
        lambda name, parameters: [
            g.text(f"functions.{name}:"),
            {"type": "regex", "pattern": _INDEX_PATTERN},
            g.literal(ARGUMENT_BEGIN, token_id),
            g.arguments(parameters, "json"),
        ],
    )
    return g.sequence([g.literal(CALL_BEGIN, token_id), calls, g.literal(CALL_END, token_id)])


def _template_variables(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    # Kimi's tokenizer code passes the TypeScript declarations (K2.5/K2.6's templates write
    # them instead of the JSON; K2's and K2-Thinking's read no such variable).
    declarations = tools_ts_str(tools)
    return {} if declarations is None else {"tools_ts_str": declarations}


def _is_kimi_k2(template: str) -> bool:
    # Kimi K3 writes <|open|>message tags instead and is not this format.
    return "<|im_assistant|>" in template and "<|im_middle|>" in template


KIMI_K2 = Family(
    name="kimi_k2",
    summary="Kimi K2 / K2-Thinking / K2.5: calls in <|tool_calls_section_begin|>, ids "
    "functions.NAME:IDX kept as the model wrote them",
    detect=_is_kimi_k2,
    parser=_parser,
    grammar=Grammar(
        call=_call,
        separator="",
        reasoning_layout=("", ""),  # Kimi writes nothing around its reasoning block
        prefix=lambda token_id: [g.literal(SECTION_BEGIN, token_id)],
        suffix=lambda token_id: [g.literal(SECTION_END, token_id)],
    ),
    decode_special_tokens=True,
    native_call_id=call_id,
    reasoning_opener=THINK_OPEN,
    reasoning_tags=(THINK_OPEN, THINK_CLOSE),
    history=(
        "writes an empty <think></think> for every assistant turn up to the last one without "
        "tool calls (its reasoning dropped); turns after it keep theirs, so a tool loop is "
        "append-only until the turn that answers without calling a tool"
    ),
    divergences=("reasoning_dropped",),
    tools_stand_in=True,
    template_variables=_template_variables,
)

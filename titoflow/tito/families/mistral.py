"""Mistral's v7 instruct format of the tekken tokenizers (Mistral Small 3 / 3.1, Devstral Small
2505; the v3 templates of Mistral-Nemo write calls the same way): the answer's text, then
optionally ``[TOOL_CALLS]`` (a control token) and the turn's calls as one JSON list up to
``</s>``::

    Let me look.[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "a"}, "id": "a1B2c3D4e"}]

Each call's ``id`` is part of the format: nine ASCII letters or digits, written back into
history (``[TOOL_CALLS][...]`` and ``[TOOL_RESULTS]ID[TOOL_CONTENT]...``), and the template
rejects any other id. So the parser returns the id the model wrote, and only when the model wrote
none makes its own, nine hex digits derived from the step (``tool_call_id``), never
``call_``/``toolu_`` ids. There is no reasoning block in these versions.

Mistral Small 3.1's own chat template (its checkpoint's, not mistral-common's) writes
``[TOOL_CALLS] [`` with a space, and models also write a single call as a bare object after the
marker; the parser reads both (as vLLM's Mistral parser does), detection knows both templates,
and Mistral-Nemo-Instruct-2407's (v3: the same calls, the system prompt written into the last
user turn).

Invariants: the parser's result depends only on the whole text, never on its chunking (content
is released only where no marker can still start; the calls, which run to the end of the output,
are parsed by ``finish``). A malformed call list goes back as text exactly as generated, with
``parse_error``; nothing is repaired beyond whitespace before the calls and a lone call object
standing for a list of one. The other control tokens, kept by the special-token
decoding this family needs for ``[TOOL_CALLS]``, are dropped from content as a decoding that
skips special tokens would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import (
    Family,
    Function,
    Grammar,
    MalformedCall,
    ParserOptions,
    TokenLookup,
    tool_call_id,
)
from titoflow.tito.families.incremental import IncrementalParser
from titoflow.tito.output import OutputParser, TextDelta

TOOL_CALLS = "[TOOL_CALLS]"
ID_LENGTH = 9
ID_PATTERN = re.compile(f"[A-Za-z0-9]{{{ID_LENGTH}}}")
_CALL_KEYS = frozenset({"name", "arguments", "id"})
# The control tokens of the tekken vocabularies besides [TOOL_CALLS]: mistral-common's named
# ones and the <SPECIAL_n> fillers of the remaining slots.
CONTROL = re.compile(
    r"<unk>|<s>|</s>|<pad>|<SPECIAL_\d{1,3}>|\[(?:INST|/INST|AVAILABLE_TOOLS|/AVAILABLE_TOOLS|"
    r"TOOL_RESULTS|/TOOL_RESULTS|IMG|IMG_BREAK|IMG_END|PREFIX|MIDDLE|SUFFIX|SYSTEM_PROMPT|"
    r"/SYSTEM_PROMPT|TOOL_CONTENT)\]"
)
# The longest marker: text after an opening bracket shorter than this may still become one.
_LONGEST_MARKER = len("[/AVAILABLE_TOOLS]")


def undecided(text: str) -> int:
    """Length of the end of ``text`` that may still grow into a marker: from its last ``[`` or
    ``<`` when no closing bracket follows it and it is short enough."""
    start = max(text.rfind("["), text.rfind("<"))
    if start < 0:
        return 0
    tail = text[start:]
    closed = "]" in tail or ">" in tail
    return 0 if closed or len(tail) >= _LONGEST_MARKER else len(tail)


def parse_calls(text: str) -> list[tuple[str, dict[str, Any], str | None]]:
    """The calls after ``[TOOL_CALLS]``: (name, arguments, id as written or None).

    Raises MalformedCall unless ``text`` is, between optional whitespace, one non-empty JSON
    list of call objects, or one call object, each with a non-empty string name, object
    arguments (absent: none) and, if given, a nine-character alphanumeric id.
    """
    # Whitespace first: Small 3.1's template writes "[TOOL_CALLS] [".
    body = text.lstrip()
    try:
        payload, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"invalid JSON: {exc.msg} at char {exc.pos}") from None
    if body[end:].strip():
        raise MalformedCall(f"text after the call list: {body[end:][:40]!r}")
    if isinstance(payload, dict):
        payload = [payload]  # one call written without its list
    if not isinstance(payload, list) or not payload:
        raise MalformedCall("not a non-empty JSON list or a call object")
    calls = []
    for number, call in enumerate(payload):
        if not isinstance(call, dict):
            raise MalformedCall(f"call {number} is not a JSON object")
        if extra := sorted(set(call) - _CALL_KEYS):
            raise MalformedCall(f"call {number} has unknown keys {extra}")
        name = call.get("name")
        if not isinstance(name, str) or not name:
            raise MalformedCall(f'call {number}: missing or non-string "name"')
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            raise MalformedCall(f'call {number}: "arguments" is not an object')
        written = call.get("id")
        if written is not None and not (isinstance(written, str) and ID_PATTERN.fullmatch(written)):
            raise MalformedCall(f'call {number}: "id" is not {ID_LENGTH} letters or digits')
        calls.append((name, arguments, written))
    return calls


class MistralParser(IncrementalParser):
    """Content up to ``[TOOL_CALLS]``, then the call list to the end of the output.

    ``read_calls`` reads what follows the first ``[TOOL_CALLS]``: the format's own (v11's
    parser sets its own).
    """

    read_calls = staticmethod(parse_calls)

    def __init__(self, options: ParserOptions) -> None:
        super().__init__(options)
        self._thinking = False  # v7 has no reasoning block
        self._in_calls = False  # _buf: content not yet released, or the call list so far

    def _advance(self, final: bool) -> None:
        if not self._in_calls:
            self._scan(final)
        if self._in_calls and final:
            self._close_calls()

    def _scan(self, final: bool) -> None:
        start = self._buf.find(TOOL_CALLS) if self._parse_tools else -1
        if start >= 0:
            self._emit(self._buf[:start])
            self._buf = self._buf[start + len(TOOL_CALLS) :]
            self._in_calls = True
            return
        held = 0 if final else undecided(self._buf)
        self._emit(self._buf[: len(self._buf) - held])
        self._buf = self._buf[len(self._buf) - held :]

    def _emit(self, text: str) -> None:
        text = CONTROL.sub("", text)
        if text:
            self._content.append(text)
            self._out.append(TextDelta(text))

    def _close_calls(self) -> None:
        try:
            calls = self.read_calls(self._buf)
        except MalformedCall as exc:
            self._error = f"{TOOL_CALLS} block 0: {exc}"
            # Exactly as generated: the marker and the list, control tokens and all.
            text = TOOL_CALLS + self._buf
            self._content.append(text)
            self._out.append(TextDelta(text))
            return
        for name, arguments, written in calls:
            self._add_call(name, arguments, written or own_id(self._step_id, len(self._calls)))


def own_id(key: str, index: int) -> str:
    """Nine hex digits (letters and digits, as the format wants), the same for the same key."""
    return tool_call_id(key, index, prefix="")[:ID_LENGTH]


def _parser(options: ParserOptions) -> OutputParser:
    return MistralParser(options)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``{"name": "NAME", "arguments": {...}, "id": "ID"}`` as the template writes it: the id is
    sampled (nine letters or digits), so a forced call re-renders to its own tokens."""
    bodies = [g.sequence(g.json_object_call(f, "arguments")) for f in functions]
    identifier = {"type": "regex", "pattern": ID_PATTERN.pattern}
    return g.sequence([g.one_of(bodies), g.text(', "id": "'), identifier, g.text('"}')])


def _opening(token_id: TokenLookup) -> list[dict[str, Any]]:
    return [g.literal(TOOL_CALLS, token_id), g.text("[")]


# How a template opens the call list: mistral-common's "[TOOL_CALLS][", Small 3.1's own
# checkpoint template "[TOOL_CALLS] [".
_OPENS_LIST = re.compile(r"\[TOOL_CALLS\] ?\[")


def _is_mistral(template: str) -> bool:
    """The v3/v7 templates write calls as ``[TOOL_CALLS]`` + a JSON list; later versions (v11+)
    write ``[TOOL_CALLS]NAME[ARGS]`` and are another format."""
    return "[INST]" in template and bool(_OPENS_LIST.search(template)) and "[ARGS]" not in template


MISTRAL = Family(
    name="mistral",
    summary=(
        "Mistral tekken v7 (Small 3.1, Devstral Small 2505; Nemo's v3 calls alike): "
        "[TOOL_CALLS][{name, arguments, id}] with 9-character call ids"
    ),
    detect=_is_mistral,
    parser=_parser,
    grammar=Grammar(call=_call, separator=", ", prefix=_opening, suffix=lambda _: [g.text("]")]),
    decode_special_tokens=True,
    # A history holds ids like the ones the model writes (nine letters or digits).
    native_call_id=own_id,
    history=(
        "renders every past turn as sampled (calls with their ids, tool results, system "
        "prompts), but writes the [AVAILABLE_TOOLS] block only before the last user message: "
        "a new user turn in a conversation with tools moves it, so that turn's prompt is "
        "rendered in full (not append-only, a new chain); a call the model wrote without an id "
        "is rendered back with the id the parser gave it. Small 3.1's own checkpoint template "
        "also writes a calling turn as the calls alone (its text dropped) and opens the list "
        "with '[TOOL_CALLS] [' where the model and mistral-common write '[TOOL_CALLS]['. "
        "Nemo's checkpoint template writes the system prompt into the last message only, when "
        "it is a user turn, and nowhere once anything follows: every turn of a conversation "
        "with a system prompt is rendered in full (a new chain)"
    ),
    assistant_starts=("[/INST]", "[/TOOL_RESULTS]", "[/SYSTEM_PROMPT]"),
    # call_content_dropped under Small 3.1's and Nemo's checkpoint templates, call_list_spaced
    # under Small 3.1's (templates/mistral_small_3_1.jinja), system_in_last_user_moved under
    # Nemo's (templates/mistral_nemo.jinja).
    divergences=(
        "tools_moved",
        "tool_call_id_added",
        "call_content_dropped",
        "call_list_spaced",
        "system_in_last_user_moved",
    ),
    tools_stand_in=True,
)

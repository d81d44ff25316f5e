"""Magistral Small 2506 (Mistral's v11 tekken format with reasoning): ``mistral_v11``'s calls
after a reasoning block the model writes as plain text, ``<think>…</think>``, at the start of
its output::

    <think>The file is a.</think>Let me look.[TOOL_CALLS]read_file[CALL_ID]a1B2c3D4e[ARGS]{...}

A family of its own rather than a mode of ``mistral_v11``: Magistral Small 2506 ships Small
3.2's tokenizer file (mistral-common says the two ``tekken.json`` files are identical), so
only the template tells them apart, and only Magistral's writes an assistant turn's reasoning
back (``<think>R</think>`` before the content, in every turn); a reasoning parser under Small
3.2's template would drop what the model wrote from history. Calls, ids, grammar and the rest
of the history are ``mistral_v11``'s.

As vLLM's ``mistral`` reasoning parser reads v11 (its text markers): a ``[TOOL_CALLS]`` inside
the reasoning ends it (the calls then run to the end of the output, a ``</think>`` after them
closing the reasoning and what follows it content). Reasoning and content are kept exactly as
written (the template renders them so); the control tokens a special-token-skipping decoding
drops are dropped from both. Magistral Small 2509 (tokenizer v13: ``[THINK]``/``[/THINK]``
control tokens, calls and results without ids, the tools before the first user message) is
another format, the ``magistral_v13`` family, whose parser is this one with v13's markers.

Invariants: ``mistral_v11``'s (the result depends on the whole text only, never its chunking; a
malformed call run goes back as text exactly as generated, with ``parse_error``); inside the
reasoning only ``</think>`` and, with tools, ``[TOOL_CALLS]`` are read.
"""

from __future__ import annotations

from titoflow.tito.families.base import Family, MalformedCall, ParserOptions
from titoflow.tito.families.mistral import CONTROL, TOOL_CALLS, undecided
from titoflow.tito.families.mistral_v11 import MISTRAL_V11, MistralV11Parser
from titoflow.tito.output import OutputParser, ReasoningDelta

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# What only the plain-thinking template writes: an assistant turn's reasoning, as text.
_WRITES_REASONING = "'<think>' ~ block['thinking']"


class MagistralParser(MistralV11Parser):
    """A leading ``<think>`` block as reasoning, then ``mistral_v11``'s content and calls
    (``opener``/``closer``: the block's markers, v13's ``[THINK]`` tokens in its subclass)."""

    opener = THINK_OPEN
    closer = THINK_CLOSE

    def __init__(self, options: ParserOptions) -> None:
        super().__init__(options)
        self._started = False  # past the point where the output could still open reasoning
        self._late_close = False  # a call ended the reasoning: its </think> may follow the calls
        self._ends = [self.closer, TOOL_CALLS] if self._parse_tools else [self.closer]

    def _advance(self, final: bool) -> None:
        if not self._started and not self._open(final):
            return
        if self._ends and self._thinking and not self._reason(final):
            return
        super()._advance(final)

    def _open(self, final: bool) -> bool:
        """Whether the output's start is decided (reasoning opened or not)."""
        opening = self._buf.lstrip()
        if opening.startswith(self.opener):
            self._buf = opening[len(self.opener) :]
            self._thinking = self._started = True
            return True
        if not final and self.opener.startswith(opening):
            return False  # nothing yet, or "<thi"
        self._started = True
        return True

    def _reason(self, final: bool) -> bool:
        """Emit reasoning up to its end; True once it ended (the rest is content)."""
        found = [(at, m) for m in self._ends if (at := self._buf.find(m)) >= 0]
        if found:
            end, marker = min(found)
            self._emit_reasoning(self._buf[:end])
            if marker == self.closer:
                self._buf = self._buf[end + len(self.closer) :]
            else:
                self._buf = self._buf[end:]  # the calls' marker, read as content next
                self._late_close = True
            self._ends = []  # the reasoning is over
            return True
        # A marker's or a control token's possible beginning waits for more text.
        held = 0 if final else undecided(self._buf)
        self._emit_reasoning(self._buf[: len(self._buf) - held])
        self._buf = self._buf[len(self._buf) - held :]
        return False

    def _emit_reasoning(self, text: str) -> None:
        text = CONTROL.sub("", text)
        if text:
            self._reasoning.append(text)
            self._out.append(ReasoningDelta(text))

    def _close_calls(self) -> None:
        calls, closer, after = self._buf.partition(self.closer)
        if self._late_close and closer and self._reads(calls):
            # The model closed its reasoning after the calls it opened inside it.
            self._buf = calls
            super()._close_calls()
            self._emit(after)
            return
        super()._close_calls()  # malformed: the whole run as generated, any closer included

    def _reads(self, calls: str) -> bool:
        try:
            self.read_calls(calls)
        except MalformedCall:
            return False
        return True


def _parser(options: ParserOptions) -> OutputParser:
    return MagistralParser(options)


def _is_magistral(template: str) -> bool:
    """A v11 template that writes an assistant turn's reasoning as ``<think>`` text."""
    return MISTRAL_V11.detect(template) and _WRITES_REASONING in template


MAGISTRAL = Family(
    name="magistral",
    summary=(
        "Magistral Small 2506 (Mistral tekken v11 with reasoning): <think>…</think> as text, "
        "then mistral_v11's [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{json} calls"
    ),
    detect=_is_magistral,
    parser=_parser,
    grammar=MISTRAL_V11.grammar,
    decode_special_tokens=True,
    native_call_id=MISTRAL_V11.native_call_id,
    reasoning_tags=(THINK_OPEN, THINK_CLOSE),
    history=(
        "as mistral_v11's, every assistant turn's reasoning written back as sampled "
        "(<think>R</think> before its content)"
    ),
    assistant_starts=MISTRAL_V11.assistant_starts,
    divergences=("tools_moved", "tool_call_id_added"),
    tools_stand_in=True,
)

"""Gemma 3 (google/gemma-3-*-it) with tool calls as vLLM serves them: vLLM's
``tool_chat_template_gemma3_pythonic.jinja`` and its ``pythonic`` tool parser. Turns are
``<start_of_turn>ROLE\\n…<end_of_turn>\\n`` (the assistant's role is ``model``); calls are the
assistant message's whole content, a Python list of keyword calls::

    <start_of_turn>model
    [get_weather(city="Paris", days=3), list_dir()]<end_of_turn>

Tool results come back in a user turn, each in ``<tool_response>…</tool_response>``. There is
no reasoning block. Google's own Gemma 3 template writes no tools: it is not detected as this
family (a request's tools would silently vanish from the prompt); docs/models.md says so.

The parser is Llama 4's pythonic one (:mod:`titoflow.tito.families.llama4`), whose invariants
hold here: the result depends only on the whole text; a call list that does not parse goes back
as generated with ``parse_error``, as does a call list inside text. Gemma has no
``<|python_start|>``: only ``[`` opens calls.

History: the template writes each argument as ``k=JSON`` (``tojson``) but never the comma
between two: its ``first`` flag is set inside the loop, where Jinja scopes it to one iteration.
A call with two or more arguments is re-rendered as ``[run(command="ls"timeout=3)]``, not
valid Python and not what the model sampled (``call_arguments_rewritten``); the chain keeps the
sampled tokens. The system prompt is written at the start of the first user turn.
"""

from __future__ import annotations

import re

from titoflow.tito.families.base import Family, ParserOptions
from titoflow.tito.families.llama4 import LLAMA4, Llama4Parser
from titoflow.tito.output import OutputParser

# The special tokens of Gemma 3's vocabulary the template writes or the model may emit.
_SPECIAL = re.compile(r"<(?:bos|eos|pad|start_of_turn|end_of_turn|start_of_image|end_of_image)>")


class Gemma3Parser(Llama4Parser):
    """Content, or the whole output as a pythonic call list (no python tag)."""

    OPENERS = ("[",)
    SPECIAL = _SPECIAL


def _parser(options: ParserOptions) -> OutputParser:
    return Gemma3Parser(options)


def _is_gemma3_pythonic(template: str) -> bool:
    # Google's own Gemma 3 template has the turn markers but no tool format: not this family.
    return "<start_of_turn>" in template and "[func_name1(" in template


GEMMA3 = Family(
    name="gemma3",
    summary="Gemma 3 via vLLM's pythonic template: [name(k=JSON, ...)] as the whole message",
    detect=_is_gemma3_pythonic,
    parser=_parser,
    # The same call list as Llama 4's (xgrammar has no pythonic style): the same grammar.
    grammar=LLAMA4.grammar,
    # Gemma 3's generation config stops on <eos> as well as <end_of_turn>.
    stop_tokens=("<eos>",),
    # As Llama 4's: the template's instruction forbids text beside calls, and vLLM's parser
    # reads such an output as text (titoflow: text with parse_error).
    content_with_calls=False,
    history=(
        "writes a call's arguments without the commas between them (the template's loop-scoped "
        "`first` flag), so a re-rendered call of two or more arguments is not valid Python and "
        "not the sampled one; the system prompt is written at the start of the first user turn"
    ),
    divergences=("call_arguments_rewritten",),
    tools_stand_in=True,
)

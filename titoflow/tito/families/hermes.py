"""Hermes 2 Pro / Hermes 3 (NousResearch): ChatML turns, JSON calls in ``<tool_call>`` blocks as
Qwen3 writes them, a fixed function-calling system prompt written before the conversation.

Hermes 3's own ``tool_use`` template writes a calling assistant turn as its calls alone (the text
the model wrote beside them is dropped) and writes no reasoning: what the model sampled is not
what a fresh render of history gives back, which is why the chain keeps it (TITO). Its calls
are Qwen3's, so the parser and the grammar are Qwen3's (vLLM serves both with its ``hermes``
tool parser); a leading ``<think>`` block is read as reasoning, as Qwen3's parser reads it.

Invariant: a template is this family's only if it writes Hermes' own function-calling system
prompt, which no Qwen template writes, so Qwen3's detection is unchanged.
"""

from __future__ import annotations

from titoflow.tito.families.base import Family, Grammar
from titoflow.tito.families.qwen3 import _hermes_call, _hermes_parser, _is_qwen3

# The sentence Hermes 2 Pro's and Hermes 3's tool_use templates open their system prompt with.
SYSTEM_PROMPT = "You are a function calling AI model."


def _is_hermes(template: str) -> bool:
    return _is_qwen3(template) and SYSTEM_PROMPT in template


HERMES = Family(
    name="hermes",
    summary="Hermes 2 Pro / Hermes 3: ChatML, JSON calls in <tool_call>, calls alone in history",
    detect=_is_hermes,
    parser=_hermes_parser,
    grammar=Grammar(call=_hermes_call),
    content_with_calls=False,
    history="writes a calling turn as its calls alone (the text beside them dropped)",
    divergences=("call_content_dropped",),
    tools_stand_in=True,
)

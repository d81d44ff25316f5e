"""NVIDIA Nemotron 3 (NVIDIA-Nemotron-3-Nano-30B-A3B and its template's kin): ChatML turns
(``<|im_start|>ROLE\\n…<|im_end|>``), reasoning in ``<think>…</think>`` that the generation
prompt opens (``<think>\\n``; ``<think></think>`` with ``enable_thinking=false``), and each call
in Qwen3-Coder's XML inside ``<tool_call>``::

    <tool_call>
    <function=NAME>
    <parameter=K>
    V
    </parameter>
    </function>
    </tool_call>

The parser is Qwen3.5's (:mod:`titoflow.tito.families.qwen3`): Qwen3-Coder's XML calls after
reasoning that a ``<tool_call>`` ends, how vLLM serves the model (the ``qwen3_coder`` tool
parser after the ``nemotron_v3`` reasoning parser). Qwen3-Coder's detector also matches this
template; without its own entry the reasoning the prompt opens would be read as content.

History: the template writes a turn's reasoning as ``<think>\\nR\\n</think>\\n`` before its
content and an empty ``<think></think>`` in a turn without reasoning; with
``truncate_history_thinking`` (its default) it drops the reasoning of every assistant turn
before the last user message, so re-rendering history would not give the sampled tokens; the
chain keeps them. Content is written stripped; tool results share one user turn.
"""

from __future__ import annotations

from titoflow.tito.families.base import Family
from titoflow.tito.families.qwen3 import QWEN3_CODER, QWEN35


def _is_nemotron3(template: str) -> bool:
    # The template variable its thinking history is switched by: in no Qwen template.
    return QWEN3_CODER.detect(template) and "truncate_history_thinking" in template


NEMOTRON3 = Family(
    name="nemotron3",
    summary="Nemotron 3: Qwen3-Coder's XML calls in <tool_call>, <think> opened by the prompt",
    detect=_is_nemotron3,
    parser=QWEN35.parser,
    grammar=QWEN35.grammar,
    reasoning_opener=QWEN35.reasoning_opener,
    reasoning_tags=QWEN35.reasoning_tags,
    history=(
        "drops the reasoning of assistant turns before the last user message (writing an empty "
        "<think></think> there), writes content stripped"
    ),
    divergences=("reasoning_dropped",),
    tools_stand_in=True,
)

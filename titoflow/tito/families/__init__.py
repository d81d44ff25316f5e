"""The model families titoflow renders, parses and constrains: the one list of them.

A family is chosen by setting (``model_family``) or, by default ("auto"), detected from the
policy's chat template; detection tries the families in ``FAMILIES`` order (the more specific
before the ones they refine, e.g. Qwen3-Coder before Qwen3) and fails with an error naming the
known families. docs/models.md describes each and how to add one.
"""

from __future__ import annotations

from titoflow.tito.families.base import Family
from titoflow.tito.families.deepseek import DEEPSEEK_V3
from titoflow.tito.families.deepseek_v4 import DEEPSEEK_V4
from titoflow.tito.families.deepseek_v32 import DEEPSEEK_V32
from titoflow.tito.families.gemma3 import GEMMA3
from titoflow.tito.families.gemma4 import GEMMA4
from titoflow.tito.families.glm45 import GLM45
from titoflow.tito.families.gpt_oss import GPT_OSS
from titoflow.tito.families.hermes import HERMES
from titoflow.tito.families.kimi_k2 import KIMI_K2
from titoflow.tito.families.llama3 import LLAMA3
from titoflow.tito.families.llama4 import LLAMA4
from titoflow.tito.families.magistral import MAGISTRAL
from titoflow.tito.families.magistral_v13 import MAGISTRAL_V13
from titoflow.tito.families.minimax_m2 import MINIMAX_M2
from titoflow.tito.families.mistral import MISTRAL
from titoflow.tito.families.mistral_v11 import MISTRAL_V11
from titoflow.tito.families.nemotron3 import NEMOTRON3
from titoflow.tito.families.nemotron_nano_v2 import NEMOTRON_NANO_V2
from titoflow.tito.families.qwen3 import QWEN3, QWEN3_CODER, QWEN35
from titoflow.tito.families.seed_oss import SEED_OSS

FAMILIES: tuple[Family, ...] = (
    QWEN35,
    NEMOTRON3,  # Qwen3-Coder's markers and its truncate_history_thinking: before Qwen3-Coder
    QWEN3_CODER,
    HERMES,  # Qwen3's markers and Hermes' own system prompt: before Qwen3
    QWEN3,
    KIMI_K2,
    MAGISTRAL,  # mistral_v11's markers and a template that writes reasoning: before it
    MAGISTRAL_V13,  # mistral_v11's markers and a template that writes [THINK]: before it
    MISTRAL_V11,
    MISTRAL,
    DEEPSEEK_V3,
    DEEPSEEK_V4,  # its <｜DSML｜tool_calls> block is its own: no other detector matches it
    DEEPSEEK_V32,  # the DSML markers are its own: no other detector matches it
    LLAMA3,
    GPT_OSS,
    GLM45,
    MINIMAX_M2,  # its markers are its own: no other detector matches it
    LLAMA4,  # <|header_start|> and the pythonic format's instruction are its own
    GEMMA3,  # <start_of_turn> and the pythonic format's instruction are its own
    GEMMA4,  # <|turn> and <|tool_call>call: are its own: no other detector matches it
    SEED_OSS,  # <seed:bos> and <seed:tool_call> are its own: no other detector matches it
    NEMOTRON_NANO_V2,  # <SPECIAL_11>Assistant and <TOOLCALL> are its own
)
NAMES: tuple[str, ...] = tuple(sorted(f.name for f in FAMILIES))
AUTO = "auto"


def family_named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"unknown model family {name!r}; known: {', '.join(NAMES)} (or {AUTO})")


def detect_family(chat_template: str | None) -> Family:
    """The family whose template this is; a ValueError naming the known families if none."""
    for family in FAMILIES:
        if chat_template and family.detect(chat_template):
            return family
    raise ValueError(
        "the policy's chat template is of no known model family; set TITOFLOW_MODEL_FAMILY "
        f"to one of: {', '.join(NAMES)}"
    )


def resolve_family(setting: str, chat_template: str | None) -> Family:
    """``setting`` as a family, detecting it from ``chat_template`` when it is "auto"."""
    return detect_family(chat_template) if setting == AUTO else family_named(setting)

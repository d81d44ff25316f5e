"""Mistral (tekken vocabulary, v7 instruct format: Mistral Small 3.1, Devstral Small 2505):
the real tokenizer, converted from the tekken vocabulary the ``mistral-common`` package ships,
and the chat template Mistral's own package generates for that format.

Sources:

- vocabulary: ``mistral_common/data/tekken_240911.json`` of ``mistral-common==1.13.1`` (PyPI),
  converted by transformers' own tekken converter
  (``transformers.integrations.mistral.tokenizer.convert_tekken_tokenizer``). The file declares
  tokenizer version v3 and no special-token list, so mistral-common's default list applies: its
  20 named control tokens (ranks 0-19: ``<s>``, ``</s>``, ``[INST]``, ``[TOOL_CALLS]``,
  ``[SYSTEM_PROMPT]``, ``[TOOL_CONTENT]``...) are exactly the ones the v7 format uses, the other
  980 of the 1000 special slots are ``<SPECIAL_n>`` fillers. The same BPE vocabulary (131072
  ids) is shared by every tekken model, so this is the v7 models' real tokenizer.
- template: ``templates/mistral.jinja``, verbatim output of mistral-common 1.13.1's
  ``mistral_common.integrations.chat_templates.chat_templates.generate_chat_template`` with
  ``spm=False, tokenizer_version=TokenizerVersion.v7, image_support=False,
  audio_support=False, thinking_support=False, default_system_prompt=None,
  plain_thinking_support=False, use_special_token_variables=True, model_settings_fields=None,
  reasoning_effort_values=None, reasoning_effort_default=None`` (the template mistral-common
  attaches to a v7 tekken tokenizer; a test checks the file still equals that output).
- checkpoint template: ``templates/mistral_small_3_1.jinja``, the chat template Mistral Small
  3.1's own checkpoint (mistralai/Mistral-Small-3.1-24B-Instruct-2503) publishes, verbatim from
  the copy ggml-org/llama.cpp keeps at
  ``models/templates/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja``, commit
  9190da2208fbaa161e10f5f0f9ab437faeacba13. It is not the directory's template (mistral-common's
  is what the model was trained on); the family tests render the corpus with it too and pin
  where it departs from mistral-common's rendering: a default system prompt with today's date
  when none is given, a tool-use paragraph prepended to the system prompt when tools are given,
  ``[AVAILABLE_TOOLS] [`` and ``[TOOL_CALLS] [`` (a space), a calling turn's text dropped,
  tool results as ``[TOOL_RESULTS] {"content": ..., "call_id": "ID"}[/TOOL_RESULTS]`` rather
  than ``[TOOL_RESULTS]ID[TOOL_CONTENT]...``, ids of 9 or more characters cut to their last 9,
  and no system message after the first.
- Nemo's checkpoint template: ``templates/mistral_nemo.jinja``, the chat template of
  mistralai/Mistral-Nemo-Instruct-2407 (a v3 tekken model: the same control tokens and call
  format), verbatim from the copy ggml-org/llama.cpp keeps at
  ``models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja`` (read at the ggerganov/llama.cpp
  mirror, commit 7b5e0803c84435e8005725d8f9ddceb5d1820443; 3945 characters). Detected as this
  family; the family tests prove the corpus on it and pin its system-prompt move: it writes the
  first system message only into the last message, when that is a user turn (``[INST]SYSTEM``
  + two newlines + the user's text), and nowhere once anything follows it.

Invariant: the directory renders and encodes every conversation token for token as
mistral-common's ``MistralTokenizer`` (v7) encodes the same request (tests/titoflow/tito/
test_family_mistral.py), which is the proof that both the conversion and the template are right.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from cli.dev.tokenizers import template_path

PACKAGES = ("mistral-common",)
STAND_IN = ""
TEKKEN = "tekken_240911.json"
TEMPLATE = "mistral.jinja"
CHECKPOINT_TEMPLATE = "mistral_small_3_1.jinja"
NEMO_TEMPLATE = "mistral_nemo.jinja"


def tekken_file() -> Path:
    """The tekken vocabulary inside the installed mistral-common package."""
    return Path(str(resources.files("mistral_common") / "data" / TEKKEN))


def write(dest: Path) -> None:
    # Imported here: converting needs mistral-common (for the default special tokens), a dev
    # dependency, and loading a built directory must not.
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    template = template_path(TEMPLATE).read_text()
    tokenizer = convert_tekken_tokenizer(str(tekken_file()), chat_template=template)
    tokenizer.save_pretrained(str(dest))
    # transformers 5 names its class TokenizersBackend; vLLM's transformers may be older and
    # knows the same fast tokenizer as PreTrainedTokenizerFast.
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")

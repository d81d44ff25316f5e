"""Mistral tekken v11 (Mistral Small 3.2, Devstral Small 2507; Magistral Small 2506's too, the
``magistral`` recipe): the v7 family's tekken vocabulary with the two control tokens v11 adds,
``[ARGS]`` and ``[CALL_ID]``, at the ranks the released v11 ``tekken.json`` gives them, and the
chat template mistral-common generates for v11.

Sources:

- vocabulary: ``mistral_common/data/tekken_240911.json`` of ``mistral-common==1.13.1``, as the
  ``mistral`` family reads it (the same 131072-id BPE vocabulary every tekken model shares).
  That file declares v3 and no special-token list; a released v11 file lists its control
  tokens. Here the list is mistral-common's default 20 (ranks 0-19, v7's), ``[ARGS]`` at rank 32
  and ``[CALL_ID]`` at 33, the rest ``<SPECIAL_n>`` fillers, and the version v11. The ranks are
  the released file's: mistral-common's own test manifest
  ``tests/data/expected/chat-sample-weather-full-released-p11i/expected.json`` (commit
  26154d4c9188178b2e07ae10f222bd841918b0c4; 542 ids mistral-common encodes with a released
  v11 ``tekken.json``, pinned there by its SHA-256) has ``[CALL_ID]`` 33 and ``[ARGS]`` 32, and
  the family test encodes that manifest's text to exactly its ids (vendored as
  ``tests/titoflow/tito/fixtures/mistral_v11/released_v11_weather.json``). The released file itself
  is in no package; the fillers' names are not checked (no model writes them).
- template: ``templates/mistral_v11.jinja``, verbatim output of mistral-common 1.13.1's
  ``generate_chat_template`` with ``spm=False, tokenizer_version=TokenizerVersion.v11``, no
  image, audio, thinking or plain thinking, no default system prompt, special-token variables
  (a test checks the file still equals that output). It writes a call as
  ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{json}``.
- checkpoint templates, for detection and the corpus proof: ``templates/mistral_small_3_2.jinja``
  (Mistral Small 3.2's own, mistralai/Mistral-Small-3.2-24B-Instruct-2506) and
  ``templates/devstral_small_2507.jinja`` (Devstral Small 2507's, as unsloth republished it),
  verbatim from the copies ggml-org/llama.cpp keeps at ``models/templates/`` (added by its
  commits 901e20bbe571fbde48d13eb188f4e7cdc7562fb6 and 00fa15fedc79263fa0285e6a3bbb0cfb3e3878a2;
  read from the fork ye-NX/llama.cpp, commit b354d7c9ecb76c97c07098617cdebbdfffa2583e). Small
  3.2's writes ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]`` as mistral-common's does; Devstral's
  ``[TOOL_CALLS]NAME[ARGS]`` with no id (v13's shape).

Invariant: the directory encodes the released v11 manifest's text to its ids, and renders and
encodes every conversation token for token as mistral-common's ``MistralTokenizer`` (v11)
encodes the same request (tests/titoflow/tito/test_family_mistral_v11.py).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from cli.dev.tokenizers import template_path
from cli.dev.tokenizers.mistral import tekken_file

PACKAGES = ("mistral-common",)
STAND_IN = ""
TEMPLATE = "mistral_v11.jinja"
SMALL_3_2_TEMPLATE = "mistral_small_3_2.jinja"
DEVSTRAL_TEMPLATE = "devstral_small_2507.jinja"
# The control tokens v11 adds, at the released tekken.json's ranks.
V11_TOKENS = {32: "[ARGS]", 33: "[CALL_ID]"}


def tekken_v11() -> dict[str, Any]:
    """mistral-common's tekken file as a v11 file: its special-token list written out."""
    # Imported here: mistral-common is a dev dependency, like the conversion that needs it.
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    data: dict[str, Any] = json.loads(tekken_file().read_text())
    named = {int(t["rank"]): str(t["token_str"]) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS}
    named |= V11_TOKENS
    data["special_tokens"] = [
        {"rank": rank, "token_str": named.get(rank, f"<SPECIAL_{rank}>"), "is_control": True}
        for rank in range(data["config"]["default_num_special_tokens"])
    ]
    data["config"]["version"] = "v11"
    return data


def write(dest: Path) -> None:
    write_converted(dest, tekken_v11(), TEMPLATE)


def write_converted(dest: Path, tekken: dict[str, Any], template_name: str) -> None:
    """The tekken file ``tekken`` converted to a tokenizer directory with the template."""
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    template = template_path(template_name).read_text()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tekken.json"
        path.write_text(json.dumps(tekken, ensure_ascii=False))
        tokenizer = convert_tekken_tokenizer(str(path), chat_template=template)
    tokenizer.save_pretrained(str(dest))
    # As the mistral recipe: vLLM's transformers may not know transformers 5's class name.
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")

"""Mistral tekken v13 with reasoning (Magistral Small 2507 and 2509, Magistral Medium 1.2):
``mistral_v11``'s tekken file with the two control tokens v13's reasoning models add,
``[THINK]`` and ``[/THINK]``, at the ranks the released v13 ``tekken.json`` gives them, and the
chat template mistral-common generates for such a file.

Sources:

- vocabulary: ``mistral_v11``'s (see ``cli/dev/tokenizers/mistral_v11.py``: mistral-common
  1.13.1's ``tekken_240911.json``, its default 20 control tokens, ``[ARGS]`` 32 and
  ``[CALL_ID]`` 33), with ``[THINK]`` at rank 34, ``[/THINK]`` at 35 and the version v13. The
  ranks are the released file's: mistral-common's test manifests (commit
  26154d4c9188178b2e07ae10f222bd841918b0c4) of its ``pinned-v13-text`` tokenizer, which its
  ``scripts/provision_test_tokenizers.py`` names as mistralai/Magistral-Small-2507's
  ``tekken.json`` (pinned by its SHA-256 93a2d5af…bfe8d):
  ``tests/data/expected/chat-v13-released-system-think`` encodes ``[THINK]`` 34 and
  ``[/THINK]`` 35, ``chat-sample-weather-full-released-p13t`` a whole tool conversation (502
  ids, ``[ARGS]`` 32); the family test encodes both manifests' texts to exactly their ids
  (vendored as ``tests/titoflow/tito/fixtures/magistral_v13/``). The released file itself is
  in no package; ``[CALL_ID]`` at 33 is v11's (v13 writes no ids, but mistral-common's v13
  encoder asks the file for that token).
- template: ``templates/magistral_v13.jinja``, verbatim output of mistral-common 1.13.1's
  ``convert_tokenizer_to_chat_template`` on this directory's tekken file (a test checks it
  still is): ``generate_chat_template`` with ``spm=False, tokenizer_version=TokenizerVersion.v13,
  image_support=True, thinking_support=True`` (thinking on because ``[THINK]`` and ``[/THINK]``
  are special; images because the packaged vocabulary carries an image config, as Magistral
  Small 2509's vision file does), no audio or plain thinking, no default system prompt,
  special-token variables. It writes an assistant turn's reasoning as ``[THINK]R[/THINK]``
  before its content, calls as ``[TOOL_CALLS]NAME[ARGS]{json}`` and results as
  ``[TOOL_RESULTS]…[/TOOL_RESULTS]`` without ids, and the tools before the first user message.
  Image chunks in user messages are not tested for this family.

Invariant: the directory encodes the released v13 manifests' texts to their ids, and renders
and encodes every conversation token for token as mistral-common's ``MistralTokenizer`` (v13)
encodes the same request (tests/titoflow/tito/test_family_magistral_v13.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli.dev.tokenizers import mistral_v11

PACKAGES = mistral_v11.PACKAGES
STAND_IN = ""
TEMPLATE = "magistral_v13.jinja"
# Its tekken file is mistral_v11's recipe's with two tokens named: stale when that one is.
BASE = "mistral_v11"
# The control tokens v13's reasoning models add, at the released tekken.json's ranks.
V13_TOKENS = {34: "[THINK]", 35: "[/THINK]"}


def tekken_v13() -> dict[str, Any]:
    """``mistral_v11``'s tekken file as a v13 reasoning model's."""
    data = mistral_v11.tekken_v11()
    for entry in data["special_tokens"]:
        entry["token_str"] = V13_TOKENS.get(entry["rank"], entry["token_str"])
    data["config"]["version"] = "v13"
    return data


def write(dest: Path) -> None:
    mistral_v11.write_converted(dest, tekken_v13(), TEMPLATE)

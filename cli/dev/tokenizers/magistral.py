"""Magistral Small 2506 (Mistral tekken v11 with reasoning as ``<think>`` text): the
``mistral_v11`` directory token for token, with the chat template mistral-common generates for
Magistral's tokenizer file.

Sources:

- vocabulary: ``mistral_v11``'s (see ``cli/dev/tokenizers/mistral_v11.py``): mistral-common
  1.13.1 says, in ``convert_tokenizer_to_chat_template``'s docstring, that
  mistralai/Magistral-Small-2506 and mistralai/Mistral-Small-3.2-24B-Instruct-2506 ship
  ``tekken.json`` files with identical ``config``, ``vocab``, ``special_tokens`` and
  ``multimodal`` sections: one vocabulary, the template alone differing.
- template: ``templates/magistral_small_2506.jinja``, verbatim output of mistral-common 1.13.1's
  ``generate_chat_template`` with ``spm=False, tokenizer_version=TokenizerVersion.v11,
  plain_thinking_support=True``, no image, audio, special-token thinking or default system
  prompt, special-token variables: what ``convert_tokenizer_to_chat_template`` makes of a v11
  tekken file without audio (its plain-thinking heuristic, written for Magistral Small 2506).
  It writes an assistant turn's ``reasoning_content`` as ``<think>R</think>`` before its
  content; the rest is ``templates/mistral_v11.jinja`` (a test checks both equal the generator's
  output). Magistral's recommended system prompt (the model card's, which asks for the
  ``<think>`` block) is the request's to send, not the template's.

Invariant: the directory's files are ``mistral_v11``'s but for the chat template
(tests/titoflow/tito/test_family_magistral.py), so the two share an end-to-end engine.
"""

from __future__ import annotations

from pathlib import Path

from cli.dev.tokenizers import mistral_v11, template_path

PACKAGES = mistral_v11.PACKAGES
STAND_IN = ""
TEMPLATE = "magistral_small_2506.jinja"
BASE = "mistral_v11"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def write(dest: Path) -> None:
    mistral_v11.write(dest)
    (dest / CHAT_TEMPLATE_FILE).write_text(template_path(TEMPLATE).read_text())

"""Hermes 3 (NousResearch, on Llama 3.1): Meta's real Llama 3 vocabulary with Hermes' ChatML
and tool markers added, and Hermes 3's own ``tool_use`` chat template beside a plain ChatML
``default`` (the two named templates Hermes 2 Pro and Hermes 3 ship).

Sources:

- Vocabulary: the ``llama3`` recipe's (``llama-models``' ``tokenizer.model``, Meta's ranks and
  256 special tokens), written first, then ``<|im_start|>`` and ``<|im_end|>`` added as special
  tokens and ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>`` as
  added tokens (one token each, kept when special tokens are skipped, as the parser reads
  them). Hermes 3's own tokenizer files are in no package or public repository found, so where
  it puts these markers (which ids) is not known here: a labelled stand-in (``STAND_IN``).
- ``templates/hermes3_tool_use.jinja``: NousResearch/Hermes-3-Llama-3.1-8B's ``tool_use``
  template verbatim from ggml-org/llama.cpp ``models/templates/
  NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja`` (read at commit
  1eeb523c3e0c7ffbd59469f5463dcbdecba3535e of the ye-NX/llama.cpp mirror; the file was last
  changed by 8b576b6c55bc4e6be898b47522f0ef402b93ef62).
- ``templates/hermes_default.jinja``: a derivative. Hermes 3's ``default`` template is in no
  public repository found; this is the ChatML template llama.cpp's
  ``tests/test-chat-template.cpp`` holds for teknium/OpenHermes-2.5-Mistral-7B (same commit)
  with ``{{bos_token}}`` put first, as Hermes 3's prompt format (``<|begin_of_text|>`` first)
  and its ``tool_use`` template write it. It renders only requests without tools.

Invariant: text ids are Meta's Llama 3 ids; every marker the templates write or the parser reads
is one token; the written files are a function of the package's bytes, the templates and this
module alone.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken

from cli.dev.tokenizers import llama3, template_path
from titoflow.tito.tokenizer import load_tokenizer

PACKAGES = llama3.PACKAGES
STAND_IN = (
    "Llama 3 vocabulary (real, llama-models) + Hermes' ChatML and tool markers appended after "
    "its 256 special tokens (Hermes 3's own tokenizer files are in no package or public repo): "
    "text ids are Llama 3's, as Hermes 3's, but the markers' ids are this stand-in's"
)
TOOL_USE_TEMPLATE = "hermes3_tool_use.jinja"
DEFAULT_TEMPLATE = "hermes_default.jinja"
SPECIALS = ("<|im_start|>", "<|im_end|>")
MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
BASE = "llama3"


def write(dest: Path) -> None:
    llama3.write(dest)
    tokenizer = load_tokenizer(dest)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": list(SPECIALS)}, replace_extra_special_tokens=False
    )
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    # <|im_end|> ends an assistant turn.
    tokenizer.eos_token = SPECIALS[1]
    tokenizer.chat_template = {
        "default": template_path(DEFAULT_TEMPLATE).read_text(),
        "tool_use": template_path(TOOL_USE_TEMPLATE).read_text(),
    }
    tokenizer.save_pretrained(dest)

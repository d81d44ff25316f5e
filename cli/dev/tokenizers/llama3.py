"""Llama 3.1+ (3.1, 3.2, 3.3 share it): Meta's real vocabulary and the official chat template.

The vocabulary is ``llama_models/llama3/tokenizer.model`` from the ``llama-models`` package
(Meta's tiktoken BPE ranks: one ``base64(token) rank`` line per token), converted to a Hugging Face
``tokenizer.json`` by transformers' ``TikTokenConverter`` with Llama 3's pre-tokenizer pattern and
its 256 special tokens after the 128,000 ranks. The conversion is tested token for token against
tiktoken's encoding (tests/titoflow/tito/test_family_llama3.py).

The chat template is meta-llama/Llama-3.1-8B-Instruct's ``tokenizer_config.json`` chat_template,
kept verbatim in ``templates/llama3.jinja`` from the copy vendored by openvinotoolkit/openvino.genai
``tests/python_tests/data/tokenizer_configs.py`` (key "meta-llama/Llama-3.1-8B-Instruct", identical
to its "meta-llama/Meta-Llama-3.1-8B-Instruct"), commit da1db864d2bc1a265e9a036f5b57ef13f0e86c2c.
``templates/llama3_2.jinja`` is Llama-3.2-3B-Instruct's from the same file (today's date through
``strftime_now``, no built-in tools), which the family tests render too.

Invariant: token ids are Meta's (``<|begin_of_text|>`` = 128000 ... ``<|eot_id|>`` = 128009), the
special-token list is the one Meta's tokenizer builds, and the written files are a function of
the package's bytes and this module alone.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path
from typing import Any

from tokenizers import processors
from transformers.convert_slow_tokenizer import TikTokenConverter

from cli.dev.tokenizers import template_path

PACKAGES = ("llama-models", "transformers", "tokenizers")
STAND_IN = ""

# Llama 3's pre-tokenizer split (the ``pat_str`` of Meta's tiktoken tokenizer).
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The named special tokens, in id order from 128000; the rest of the 256 are reserved slots.
NAMED_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",  # end of a message a built-in tool's result continues (ipython)
    "<|eot_id|>",  # end of turn
    "<|python_tag|>",
    "<|image|>",
)
SPECIAL_COUNT = 256
BASE_VOCAB = 128000
MODEL_MAX_LENGTH = 131072
TEMPLATE = "llama3.jinja"


def special_tokens() -> list[str]:
    reserved = SPECIAL_COUNT - len(NAMED_SPECIALS)
    return [*NAMED_SPECIALS, *(f"<|reserved_special_token_{2 + i}|>" for i in range(reserved))]


def ranks_path() -> Path:
    """``tokenizer.model`` inside the installed ``llama-models``, found without importing it."""
    spec = importlib.util.find_spec("llama_models")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llama-models is not installed; it provides the Llama 3 vocabulary")
    path = Path(next(iter(spec.submodule_search_locations))) / "llama3" / "tokenizer.model"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from llama-models")
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    """tiktoken's BPE file: ``base64(token) rank`` per line."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


class _Converter(TikTokenConverter):
    """Reads the ranks itself: tiktoken's loader would cache a copy of the file under /tmp."""

    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        return load_ranks(Path(tiktoken_url))


def _added_token(content: str) -> dict[str, Any]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def write_meta_tokenizer(
    dest: Path,
    *,
    model: str,
    ranks: Path,
    pattern: str,
    specials: list[str],
    base_vocab: int,
    tokens: dict[str, str],
    template: str,
    model_max_length: int,
) -> None:
    """Meta's tiktoken ``ranks`` and ``specials`` (ids from ``base_vocab``, the first one
    ``<|begin_of_text|>``) as a Hugging Face tokenizer directory: ``tokens`` (bos, eos, pad)
    and the chat ``template`` in its config, as Meta's tokenizer_config has them."""
    converter = _Converter(  # type: ignore[no-untyped-call]
        vocab_file=str(ranks), pattern=pattern, extra_special_tokens=specials
    )
    tokenizer = converter.converted()
    if tokenizer.token_to_id(specials[0]) != base_vocab:
        raise RuntimeError(f"the {model} ranks did not give a {base_vocab:,}-token base vocabulary")
    # As Meta's Hugging Face tokenizer: encoding with special tokens starts with <|begin_of_text|>.
    bos = specials[0]
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A",
                pair=f"{bos} $A {bos}:1 $B:1",
                special_tokens=[(bos, base_vocab)],
            ),
        ]
    )
    tokenizer.save(str(dest / "tokenizer.json"))
    config = {
        "added_tokens_decoder": {
            str(base_vocab + i): _added_token(token) for i, token in enumerate(specials)
        },
        **tokens,
        "chat_template": template_path(template).read_text(),
        # Meta's file says true, which would rewrite " ," and " ." in decoded JSON arguments;
        # transformers 5 ignores it for BPE (with a warning), older versions apply it.
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (dest / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    )


def write(dest: Path) -> None:
    specials = special_tokens()
    # As Meta's tokenizer_config: the template writes <|begin_of_text|> itself, <|eot_id|> ends
    # an assistant turn.
    tokens = {"bos_token": specials[0], "eos_token": "<|eot_id|>"}
    write_meta_tokenizer(
        dest,
        model="Llama 3",
        ranks=ranks_path(),
        pattern=PATTERN,
        specials=specials,
        base_vocab=BASE_VOCAB,
        tokens=tokens,
        template=TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
    )

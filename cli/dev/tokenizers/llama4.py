"""Llama 4 (Scout, Maverick): Meta's real vocabulary and vLLM's pythonic tool-call template.

The vocabulary is ``llama_models/llama4/tokenizer.model`` from the ``llama-models`` package
(Meta's tiktoken BPE ranks, 200,000 of them), converted to a Hugging Face ``tokenizer.json`` by
transformers' ``TikTokenConverter`` with Llama 4's pre-tokenizer pattern (``O200K_PATTERN``) and
the 2,048 special tokens Meta's ``Tokenizer`` builds after the ranks, read from the package's own
lists. tests/titoflow/tito/test_family_llama4.py holds the conversion to that tokenizer's ids.

The chat template is vLLM's ``examples/tool_chat_template_llama4_pythonic.jinja``
(vllm-project/vllm, commit 0471aed1b67455f39accc28977db0b979e091687, 7,165 characters), kept
verbatim in ``templates/llama4_pythonic.jinja``: the template vLLM's tool-calling docs name for
Llama 4 with the ``llama4_pythonic`` parser. It is a derivative, not Meta's checkpoint template
(which writes calls as JSON ``{"name": …, "parameters": …}``): it writes calls as
``[name(k="v", …)]``, the way Meta's Llama 4 prompt format documents pythonic calls.

Invariant: token ids are Meta's (``<|begin_of_text|>`` = 200000, ``<|eot|>`` = 200008), the
special-token list is the one Meta's tokenizer builds, and the written files are a function of
the package's bytes, the template and this module alone.
"""

from __future__ import annotations

from pathlib import Path

from llama_models.llama4 import tokenizer as meta  # type: ignore[import-untyped]

from cli.dev.tokenizers.llama3 import write_meta_tokenizer

PACKAGES = ("llama-models", "transformers", "tokenizers")
STAND_IN = ""
BASE_VOCAB = 200000
MODEL_MAX_LENGTH = 10485760  # Scout's context, as its tokenizer_config says
TEMPLATE = "llama4_pythonic.jinja"


def special_tokens() -> list[str]:
    """Meta's order: the basic tokens, Llama 4's, then reserved slots up to 2,048."""
    named = [*meta.BASIC_SPECIAL_TOKENS, *meta.LLAMA4_SPECIAL_TOKENS]
    reserved = meta.Tokenizer.num_reserved_special_tokens - len(named)
    return [*named, *(f"<|reserved_special_token_{i}|>" for i in range(reserved))]


def ranks_path() -> Path:
    return Path(meta.__file__).parent / "tokenizer.model"


def write(dest: Path) -> None:
    specials = special_tokens()
    tokens = {
        "bos_token": specials[0],
        "eos_token": "<|eot|>",
        "pad_token": "<|finetune_right_pad|>",
    }
    write_meta_tokenizer(
        dest,
        model="Llama 4",
        ranks=ranks_path(),
        pattern=meta.Tokenizer.O200K_PATTERN,
        specials=specials,
        base_vocab=BASE_VOCAB,
        tokens=tokens,
        template=TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
    )

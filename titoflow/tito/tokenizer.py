"""Loads the policy's tokenizer and chat template from a local model directory, never a hub.

Invariant: a directory gives the token ids vLLM's own loader gives for it, checked against the
engine environment's loader for every family (tests/titoflow/tito/test_tokenizer_parity.py), and a
tokenizer's own code runs only when allowed; allowed, it loads as vLLM loads it or not at all
(tests/titoflow/tito/test_kimi_remote_code.py).

Mistral's checkpoints ship ``tekken.json``, which vLLM reads with mistral-common in
``tokenizer_mode=mistral``: what Mistral's model cards prescribe and what vLLM picks by itself
for a directory with ``consolidated*.safetensors``, so the ids a Mistral model is served (and was
trained) with. Where the directory also has the Hugging Face files, they are loaded with the
pre-tokenizer tekken.json defines: transformers warns that the ``tokenizer.json`` of Mistral
Small 3.1 and others has an "incorrect regex pattern" (its tekken converter once wrote the
generic tiktoken one, whose contractions take the ``'d`` of ``'def``), which encodes some text
otherwise than tekken, and vLLM's Hugging Face mode serves that file as written. One difference
from the Mistral mode stays, declared in docs/models.md: text that spells a control token
(``[INST]``) is plain text to mistral-common and that token here, as in vLLM's Hugging Face
mode, since titoflow encodes the rendered template as one text.
A directory with tekken.json alone is refused in one line naming the fix rather than
converted here: titoflow renders with the directory's Jinja chat template, which tekken.json
does not carry (vLLM's Mistral mode renders with mistral-common's request encoder instead), so
a conversion would have to guess the one part whose wording the model was trained on.
"""

from __future__ import annotations

import json
import os
import unicodedata
import weakref
from pathlib import Path
from typing import Any

# Checked at import time by transformers/huggingface_hub: no process of ours downloads a model.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # silences "PyTorch was not found"

import transformers
from tokenizers import Regex, pre_tokenizers

TEKKEN = "tekken.json"


class RemoteCodeRefused(ValueError):
    """The directory's tokenizer is its own code (``auto_map``), which was not allowed."""


class RemoteCodeFailed(ValueError):
    """The directory's tokenizer code, allowed, does not import (Kimi's K2-era file names a
    transformers 4 location): vLLM's loader, the same AutoTokenizer call, fails alike."""


def load_tokenizer(model_path: Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer of ``model_path`` as vLLM loads it (``trust_remote_code`` as its flag)."""
    config_file = model_path / "tokenizer_config.json"
    tekken = model_path / TEKKEN
    if not config_file.exists() and tekken.exists():
        raise FileNotFoundError(
            f"{model_path} has Mistral's {TEKKEN} but no tokenizer_config.json: titoflow renders "
            "with the Hugging Face files and their chat template; use the checkpoint's HF-format "
            "files, or write them into it with transformers' convert_tekken_tokenizer(tekken.json, "
            "chat_template=mistral-common's generate_chat_template(...)).save_pretrained(dir)"
        )
    if not config_file.exists():
        raise FileNotFoundError(
            f"no tokenizer at {model_path}: build the local model with `titoflow build-model` "
            "or point TITOFLOW_MODEL_PATH at an HF model directory"
        )
    config = json.loads(config_file.read_text())
    if "auto_map" in config:
        if not trust_remote_code:
            raise RemoteCodeRefused(
                f"the tokenizer at {model_path} is code the directory ships (auto_map in "
                "tokenizer_config.json): allow it with TITOFLOW_TRUST_REMOTE_CODE=1, as vLLM's "
                "--trust-remote-code"
            )
        try:
            return transformers.AutoTokenizer.from_pretrained(
                model_path, local_files_only=True, trust_remote_code=True
            )
        except ImportError as exc:  # else a traceback from inside the directory's module
            raise RemoteCodeFailed(
                f"the tokenizer code at {model_path} does not import under transformers "
                f"{transformers.__version__} (AutoTokenizer, as vLLM loads it): {exc}"
            ) from exc
    tokenizer = _named_class(model_path, config).from_pretrained(model_path, local_files_only=True)
    if tekken.exists():
        tokenizer.backend_tokenizer.pre_tokenizer = _tekken_pre_tokenizer(tekken)
    return tokenizer


def _tekken_pre_tokenizer(tekken: Path) -> Any:
    """The pre-tokenizer of a tekken file as transformers' tekken converter writes it: the
    file's own pattern, then bytes (tiktoken's pipeline, which mistral-common runs)."""
    pattern = json.loads(tekken.read_text(encoding="utf-8"))["config"]["pattern"]
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _named_class(model_path: Path, config: dict[str, Any]) -> Any:
    """The class AutoTokenizer picks for a directory without remote code, without importing it:
    it imports the model-config machinery, which imports torch wherever it is installed (a
    trainer host with titoflow[torch]): a second of start-up and its memory in every service.

    The class the directory names, except a Llama class over a byte-level ``tokenizer.json``
    (DeepSeek V3.x ships that pair): transformers' Llama class rebuilds a SentencePiece-style
    pipeline and would ignore the file's (``"Hello world"`` 3 ids instead of 2, CJK dropped),
    so, as AutoTokenizer does, the file is loaded as written."""
    named = config.get("tokenizer_class")
    if not isinstance(named, str) or getattr(transformers, named, None) is None:
        return transformers.AutoTokenizer
    if named.removesuffix("Fast") == "LlamaTokenizer" and _byte_level(model_path):
        return transformers.TokenizersBackend
    return getattr(transformers, named)


def _byte_level(model_path: Path) -> bool:
    """Whether the directory's ``tokenizer.json`` pre-tokenizes or decodes at the byte level."""
    try:
        spec = json.loads((model_path / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return "ByteLevel" in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])


class TooLong(ValueError):
    """The text has at least ``at_least`` tokens, more than the budget it was encoded within:
    counted by the tokenizer (``counted``), or bounded from its length without tokenizing it."""

    def __init__(self, at_least: int, counted: bool) -> None:
        super().__init__(f"at least {at_least} tokens")
        self.at_least = at_least
        self.counted = counted


# Characters from which a text is encoded with the GIL released (a few ms of work).
LONG_TEXT = 4_096


class TextEncoder:
    """``tokenizer.encode(text, add_special_tokens=False)``, called on the Rust backend directly
    when that gives the same ids: no truncation or padding configured on it (transformers turns
    them off per call) and special tokens split as transformers splits them. transformers'
    wrapper around the backend is a large share of a short text's encode, and so of the TITO
    continuation (docs/benchmarks.md §1–2).

    Long texts go through the backend's batch call, which releases the GIL while it works (a
    single encode holds it for the whole text, and no other thread runs meanwhile); same ids, a
    little more a call. :meth:`within` refuses a text over a budget of tokens without making
    its ids into Python ints, which for a huge tool result holds the GIL too (figures:
    docs/benchmarks.md §9)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        direct = backend is not None and (
            backend.truncation is None
            and backend.padding is None
            and backend.encode_special_tokens
            == bool(getattr(tokenizer, "split_special_tokens", False))
        )
        self._backend = backend if direct else None
        self._widest = _widest_token(tokenizer)
        self._normalizer = backend.normalizer if backend is not None else None
        # A Unicode form the standard library applies in C, else None (the normalizer's own).
        state = json.loads(self._normalizer.__getstate__()) if self._normalizer else {}
        self._form = state.get("type") if state.get("type") in UNICODE_FORMS else None

    def __call__(self, text: str) -> list[int]:
        backend = self._backend
        if backend is not None and len(text) < LONG_TEXT:  # the hot path: a turn's new text
            return backend.encode(text, add_special_tokens=False).ids  # type: ignore[no-any-return]
        return self.within(text, None)

    def within(self, text: str, budget: int | None) -> list[int]:
        """The ids of ``text``; with ``budget``, :class:`TooLong` instead where it has more
        tokens than that, known from :meth:`min_tokens` before tokenizing where it can be."""
        if budget is not None and len(text) > budget:  # else no text can be over the budget
            at_least = self.min_tokens(text)
            if at_least > budget:
                raise TooLong(at_least, counted=False)
        backend = self._backend
        if backend is None:
            ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        elif len(text) < LONG_TEXT:
            return backend.encode(text, add_special_tokens=False).ids  # type: ignore[no-any-return]
        else:
            encoding = backend.encode_batch([text], add_special_tokens=False)[0]
            if budget is not None and len(encoding) > budget:
                raise TooLong(len(encoding), counted=True)
            ids = encoding.ids
        if budget is not None and len(ids) > budget:
            raise TooLong(len(ids), counted=True)
        return ids

    def min_tokens(self, text: str) -> int:
        """A number of tokens ``text`` encodes to at least, cheaply: its length after the
        tokenizer's normalizer, over the most characters one token covers (the longest
        vocabulary entry or special token; a byte-level entry spells one byte a character, and
        a character is at least a byte). 0 for a tokenizer without a Rust backend."""
        if not self._widest:
            return 0
        return -(-self._normalized_length(text) // self._widest)

    def _normalized_length(self, text: str) -> int:
        if self._normalizer is None or text.isascii():  # isascii is a flag of the string: O(1)
            return len(text)
        if self._form is not None:  # C-level, and a quick check first
            if unicodedata.is_normalized(self._form, text):
                return len(text)
            return len(unicodedata.normalize(self._form, text))
        return len(self._normalizer.normalize_str(text))


UNICODE_FORMS = ("NFC", "NFKC", "NFD", "NFKD")

# Per tokenizer object: reading the vocabulary takes 0.35 s (150k entries), once, at start; in a
# long request's render it held the GIL, and with it every other session, for that long.
_WIDEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _widest_token(tokenizer: Any) -> int:
    """The most characters of any vocabulary entry or special token (0: no Rust backend)."""
    widest = _WIDEST.get(tokenizer)
    if widest is None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        vocabulary = backend.get_vocab(with_added_tokens=True) if backend is not None else {}
        widest = _WIDEST[tokenizer] = max(map(len, vocabulary), default=0)
    return widest

"""The cheap lower bound on a text's token count (``TextEncoder.min_tokens``)
never exceeds the count, for every family's tokenizer: the ingress refuses a prompt as too long
for the context from it, so a bound above the truth would refuse a prompt that fits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.dev.tokenizers import SOURCES
from tests.support.families import family_tokenizer
from titoflow.tito.tokenizer import TextEncoder

# Texts a tokenizer covers with few tokens: long runs its vocabulary has merges for, special
# tokens, and characters its normalizer composes (NFC makes "e" + U+0301 one character).
_DENSE = st.sampled_from(
    [
        " ",
        "-",
        "=",
        "\n",
        "\t",
        "//",
        "0",
        "e\u0301",
        "\u1100\u1161\u11a8",  # Hangul jamo: three characters that NFC composes into one
        "<|im_start|>",
        "<|endoftext|>",
        "the ",
        "function ",
    ]
)
_RUNS = st.lists(st.tuples(_DENSE, st.integers(1, 400)), max_size=12).map(
    lambda runs: "".join(piece * times for piece, times in runs)
)
TEXTS = st.one_of(st.text(max_size=400), _RUNS, st.tuples(st.text(max_size=50), _RUNS).map("".join))


@pytest.mark.parametrize("family", sorted(SOURCES))
@settings(max_examples=60, deadline=None)
@given(text=TEXTS)
def test_lower_bound_is_at_most_the_token_count(family: str, text: str) -> None:
    tokenizer = family_tokenizer(family)
    assert TextEncoder(tokenizer).min_tokens(text) <= len(TextEncoder(tokenizer)(text))


def test_long_texts_encode_as_short_ones_do() -> None:
    """Texts from ``LONG_TEXT`` characters are encoded by the GIL-releasing batch call: the
    same ids as the single call."""
    tokenizer = family_tokenizer("qwen3")
    text = "status: ok, value=17 ünïcödé " * 2000
    assert TextEncoder(tokenizer)(text) == tokenizer.encode(text, add_special_tokens=False)

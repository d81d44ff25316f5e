"""Streaming text deltas concatenate to exactly the decode of all tokens."""

from __future__ import annotations

import random

import pytest

from ingress.turns.detokenize import IncrementalDecoder, StopTrimmer
from tests.support.families import qwen3


@pytest.mark.parametrize("seed", range(20))
def test_deltas_add_up_to_the_full_decode(seed: int) -> None:
    tokenizer = qwen3()
    rng = random.Random(seed)
    # Random ids split multi-byte characters across tokens, the hard case for streaming.
    ids = [rng.randrange(0, 151_643) for _ in range(rng.randrange(1, 120))]
    decoder = IncrementalDecoder(tokenizer)
    pieces, at = [], 0
    while at < len(ids):
        step = rng.choice([1, 1, 1, 2, 5])
        pieces.append(decoder.push(ids[at : at + step]))
        at += step
    pieces.append(decoder.flush())
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces[:-1]) or "\ufffd" in tokenizer.decode(ids)


@pytest.mark.parametrize("chunking", [1, 2, 3, 100])
def test_stop_strings_cut_the_visible_text_at_their_first_match(chunking: int) -> None:
    text = "Thought: call it\nObservation: the tool said hi"
    trimmer = StopTrimmer(("Observation:", "Calling tools:"))
    out = "".join(trimmer.push(text[i : i + chunking]) for i in range(0, len(text), chunking))
    assert out + trimmer.flush() == "Thought: call it\n" and trimmer.stopped
    untouched = StopTrimmer(("zzz",))
    assert untouched.push("ab") + untouched.push("c") + untouched.flush() == "abc"

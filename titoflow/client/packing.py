"""Sequences → the rows of a training batch, one sequence per row or packed to a token budget.

Invariant: a sequence is never split, reordered or altered. Rows hold whole sequences back to
back, in input order, then padding; ``position_ids`` restart at 0 with every sequence and
``sequence_ids`` name the sequence each position belongs to (-1: padding), so attention can be
kept within sequences: flash-attn's varlen kernels take ``cu_seqlens`` (offsets of the sequences
in the row-major concatenation of the rows' real tokens), Hugging Face's packed training takes
the restarting ``position_ids``. No sequence's first token is trainable (a segment starts with
its prompt), so the prediction a packed row makes across a boundary is never in the loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# What padding holds, per key (``input_ids``: the caller's pad id). A padded position is never in
# the loss and belongs to no sequence.
PAD_VALUES: Mapping[str, float] = {
    "loss_mask": 0.0,
    "old_logprobs": 0.0,
    "logprob_source": 0,
    "weight_version": -1,
}


def pack_greedy(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of the sequences of each row, in order: a row is closed when the next sequence
    would take it over ``budget`` tokens. ValueError for a sequence longer than the budget (it
    cannot be packed without splitting it: raise the budget, or filter it out of the source)."""
    if budget < 1:
        raise ValueError("the token budget must be at least 1")
    rows: list[list[int]] = []
    used = budget  # no open row yet
    for index, length in enumerate(lengths):
        if length > budget:
            raise ValueError(
                f"a sequence of {length} tokens exceeds the packing budget of {budget}: raise "
                "the budget or filter longer sequences out of the source"
            )
        if used + length > budget:
            rows.append([])
            used = 0
        rows[-1].append(index)
        used += length
    return rows


def lay_out(
    sequences: Sequence[Mapping[str, np.ndarray]],
    rows: Sequence[Sequence[int]],
    pad_id: int,
    pad_to_multiple_of: int = 1,
) -> dict[str, np.ndarray]:
    """``[len(rows), length]`` arrays: each key of the sequences (1-D, aligned, ``input_ids``
    among them) with the sequences of each row back to back, then padding (:data:`PAD_VALUES`),
    plus ``position_ids``, ``sequence_ids`` and ``cu_seqlens`` (int32, ``len(sequences) + 1``).
    ``length`` is the longest row, rounded up to ``pad_to_multiple_of``. ``rows`` must list every
    sequence once, in order (as :func:`pack_greedy` does, or one per row)."""
    if [i for row in rows for i in row] != list(range(len(sequences))):
        raise ValueError("rows must list every sequence once, in order")
    if not sequences:
        raise ValueError("no sequences to lay out")
    if pad_to_multiple_of < 1:
        raise ValueError("pad_to_multiple_of must be at least 1")
    lengths = [len(sequence["input_ids"]) for sequence in sequences]
    for index, sequence in enumerate(sequences):
        if sequence["loss_mask"][:1].any():
            raise ValueError(
                f"sequence {index}: its first token is in the loss, no position predicts it"
            )
    longest = max(sum(lengths[i] for i in row) for row in rows)
    length = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    size = (len(rows), length)
    out = {
        key: np.full(size, pad_id if key == "input_ids" else PAD_VALUES[key], dtype=array.dtype)
        for key, array in sequences[0].items()
    }
    out["position_ids"] = np.zeros(size, dtype=np.int64)
    out["sequence_ids"] = np.full(size, -1, dtype=np.int64)
    for r, row in enumerate(rows):
        start = 0
        for index in row:
            end = start + lengths[index]
            for key, array in sequences[index].items():
                out[key][r, start:end] = array
            out["position_ids"][r, start:end] = np.arange(lengths[index])
            out["sequence_ids"][r, start:end] = index
            start = end
    out["cu_seqlens"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return out

"""What a packed item of the torch dataset (titoflow/client/torch_data.py) must hold, checked
by the dataset's tests and the trainer loop's: each segment whole, contiguous in one row, bit for
bit, and the padding ``PAD`` with no loss and no weight version.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from schemas.events import SegmentFinalized

PAD = 151643


def float_bits(values: Any) -> list[int]:
    bits: list[int] = np.asarray(values, dtype=np.float32).view(np.int32).tolist()
    return bits


def check_item_holds(item: dict[str, Any], segments: list[SegmentFinalized]) -> None:
    """Each sequence of ``item`` is its segment, whole, contiguous in one row, bit for bit."""
    assert item["segment_ids"] == [s.segment_id for s in segments]
    lengths = [len(s.token_ids) for s in segments]
    assert item["cu_seqlens"].tolist() == [0, *itertools.accumulate(lengths)]
    ids = item["sequence_ids"]
    real = ids >= 0
    # cu_seqlens indexes the rows' real tokens, row-major: the sequences in order.
    assert ids[real].tolist() == [i for i, n in enumerate(lengths) for _ in range(n)]
    for i, segment in enumerate(segments):
        rows, cols = torch.nonzero(ids == i, as_tuple=True)
        assert len(set(rows.tolist())) == 1, "a sequence is never split across rows"
        assert cols.tolist() == list(range(int(cols[0]), int(cols[0]) + lengths[i]))
        at = (rows, cols)
        assert item["input_ids"][at].tolist() == segment.token_ids
        assert item["position_ids"][at].tolist() == list(range(lengths[i]))
        assert item["loss_mask"][at].tolist() == segment.loss_mask
        assert item["logprob_source"][at].tolist() == segment.logprob_source
        known = np.asarray(segment.logprob_source) != 0
        expected = np.where(known, np.asarray(segment.logprobs, np.float32), np.float32(0))
        assert float_bits(item["old_logprobs"][at]) == float_bits(expected)
    pad = ~real
    assert (item["input_ids"][pad] == PAD).all() and (item["loss_mask"][pad] == 0).all()
    assert (item["position_ids"][pad] == 0).all() and (item["weight_version"][pad] == -1).all()

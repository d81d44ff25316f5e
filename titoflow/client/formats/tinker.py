"""A segment → the fields of a Tinker ``Datum`` (thinking-machines-lab/tinker,
``src/tinker/types/datum.py``): ``model_input`` and ``loss_fn_inputs``.

Invariant: the next-token alignment Tinker's losses use: ``model_input`` is the tokens but the
last, and every ``loss_fn_inputs`` array has one entry per input position, for the token after
it (``target_tokens`` is the tokens but the first). Without an advantage the inputs are those of
``cross_entropy`` (``target_tokens``, ``weights``); with one, those of the policy-gradient losses
(``importance_sampling``, ``ppo``, ``cispo``: ``target_tokens``, ``logprobs``, ``advantages``).
Build one with ``tinker.Datum(model_input=tinker.ModelInput.model_validate(d["model_input"]),
loss_fn_inputs=d["loss_fn_inputs"])``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays
from titoflow.client.formats.common import refuse_images


def to_tinker(segment: SegmentFinalized, advantage: float | None = None) -> dict[str, Any]:
    """``model_input`` as ``ModelInput``'s fields (one ``encoded_text`` chunk) and
    ``loss_fn_inputs`` as numpy arrays (int64 targets, float32 others: Tinker's dtypes).
    ``advantage`` is the segment's (e.g. group-relative), put on its generated tokens."""
    refuse_images([segment], "to_tinker does not carry images (Tinker's image chunks)")
    ids, mask, logprobs = aligned_arrays(segment)
    if len(ids) < 2:
        raise ValueError(f"segment {segment.segment_id}: fewer than 2 tokens, nothing to predict")
    weights = mask[1:].astype(np.float32)
    inputs: dict[str, np.ndarray] = {"target_tokens": ids[1:].astype(np.int64)}
    if advantage is None:
        inputs["weights"] = weights
    else:
        inputs["logprobs"] = logprobs[1:]
        inputs["advantages"] = weights * np.float32(advantage)
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": ids[:-1].tolist()}]},
        "loss_fn_inputs": inputs,
    }

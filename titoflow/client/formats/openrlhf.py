"""Segments → the tensors of an OpenRLHF ``Experience`` (``openrlhf/trainer/ppo_utils/
experience.py``), laid out as its agent path makes one from a rollout
(``samples_generator.py``, ``_process_response_into_experience``).

Invariant: ``sequences`` and ``attention_mask`` are ``[batch, T]`` (right-padded); the action
arrays are ``[batch, T - 1]``, position ``t`` for the token at ``t + 1`` (the one the logits at
``t`` predict), as OpenRLHF shifts them. Build one with
``Experience(**{k: torch.from_numpy(v) for k, v in fields.items()})``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays
from titoflow.client.formats.common import refuse_images, truncated


def to_openrlhf(segments: Sequence[SegmentFinalized], pad_id: int) -> dict[str, np.ndarray]:
    """The tensors of one ``Experience`` over ``segments``; ``rewards`` only when every segment
    has a scalar reward."""
    if not segments:
        raise ValueError("no segments to batch")
    refuse_images(segments, "to_openrlhf does not carry images (use SegmentDataset or to_verl)")
    arrays = [aligned_arrays(segment) for segment in segments]
    size, length = len(segments), max(len(ids) for ids, _, _ in arrays)
    sequences = np.full((size, length), pad_id, dtype=np.int64)
    attention_mask = np.zeros((size, length), dtype=np.int64)
    action_mask = np.zeros((size, length - 1), dtype=bool)
    rollout_log_probs = np.zeros((size, length - 1), dtype=np.float32)
    response_length = np.zeros(size, dtype=np.int64)
    for row, (ids, mask, logprobs) in enumerate(arrays):
        n = len(ids)
        sequences[row, :n] = ids
        attention_mask[row, :n] = 1
        action_mask[row, : n - 1] = mask[1:].astype(bool)
        rollout_log_probs[row, : n - 1] = logprobs[1:]
        actions = np.flatnonzero(mask)
        # OpenRLHF's: the span from the first action token to the last.
        response_length[row] = actions[-1] - actions[0] + 1 if len(actions) else 0
    fields = {
        "sequences": sequences,
        "attention_mask": attention_mask,
        "action_mask": action_mask,
        "rollout_log_probs": rollout_log_probs,
        "response_length": response_length,
        "truncated": np.array([truncated(segment) for segment in segments], dtype=bool),
        "total_length": attention_mask.sum(axis=1).astype(np.float32),
    }
    if all(segment.reward is not None for segment in segments):
        fields["rewards"] = np.array([segment.reward for segment in segments], dtype=np.float32)
    return fields

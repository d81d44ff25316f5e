"""Segments → the fields of Tinker ``Datum``s (thinking-machines-lab/tinker,
``src/tinker/types/datum.py``) as tinker-cookbook's RL loop builds them
(``tinker_cookbook/rl/data_processing.py``: ``compute_advantages``, ``trajectory_to_data``,
``assemble_training_data``, 0.6.1).

Invariant: the next-token alignment Tinker's losses use: ``model_input`` is the tokens but the
last, and every ``loss_fn_inputs`` array has one entry per input position, for the token after
it (``target_tokens`` is the tokens but the first). Without an advantage the inputs are those of
``cross_entropy`` (``target_tokens``, ``weights``); with one, tinker-cookbook's
(``target_tokens``, ``logprobs``, ``advantages``, ``mask``: the inputs of ``importance_sampling``,
``ppo`` and ``cispo``, and the ``mask`` its ``train_step`` drops before sending and its
``compute_kl_sample_train`` reads). Tinker's training forward is ``log_softmax(logits)``, so
logprobs sampled at another temperature or with a cut are refused, not passed on.
:func:`to_tinker_batch` is ``assemble_training_data``'s output for the segments as a cookbook
rollout of the same sessions: groups are instances, trajectories are rollouts (a split
session's segments are one trajectory, several ``Datum``s), advantages are rewards centred in
their group. Build one with ``tinker.Datum(model_input=tinker.ModelInput.model_validate(
d["model_input"]), loss_fn_inputs=d["loss_fn_inputs"])``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays, group_by_instance
from titoflow.client.formats.common import refuse_images, refuse_other_policies


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
        refuse_other_policies(segment, 1.0, "Tinker")
        inputs["logprobs"] = logprobs[1:]
        # 0.0 off the mask, not advantage × 0 (-0.0 for a negative one), as cookbook builds it.
        inputs["advantages"] = np.where(mask[1:] > 0, np.float32(advantage), np.float32(0.0))
        inputs["mask"] = weights
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": ids[:-1].tolist()}]},
        "loss_fn_inputs": inputs,
    }


def to_tinker_batch(
    segments: Sequence[SegmentFinalized],
) -> tuple[list[dict[str, Any]], list[dict[str, int]]]:
    """``(data, metadata)`` as ``assemble_training_data`` returns them: one datum per segment,
    group by group (instances, in arrival order), each with its trajectory's advantage (its
    reward minus its group's mean over trajectories, ``compute_advantages``), and per datum its
    ``group_idx`` and ``traj_idx`` (the rollout: ``rollout_id``, else the session). Unused
    samples are left out; a segment without a reward, or a rollout whose segments differ in
    reward, raises ``ValueError``."""
    data: list[dict[str, Any]] = []
    metadata: list[dict[str, int]] = []
    used = [segment for segment in segments if not segment.unused_sample]
    for group_idx, group in enumerate(group_by_instance(used).values()):
        rollouts: dict[str, list[SegmentFinalized]] = {}
        for segment in group:
            rollouts.setdefault(segment.rollout_id or segment.session_id, []).append(segment)
        rewards = [_reward(key, found) for key, found in rollouts.items()]
        mean = np.mean(np.asarray(rewards, np.float32))  # float32, as compute_advantages' tensor
        for traj_idx, (found, reward) in enumerate(zip(rollouts.values(), rewards, strict=True)):
            advantage = float(np.float32(reward) - mean)
            for segment in found:
                data.append(to_tinker(segment, advantage))
                metadata.append({"group_idx": group_idx, "traj_idx": traj_idx})
    return data, metadata


def _reward(rollout: str, segments: list[SegmentFinalized]) -> float:
    """The one reward of a rollout's segments (tinker-cookbook counts a trajectory's once)."""
    known = {segment.reward for segment in segments if segment.reward is not None}
    if any(segment.reward is None for segment in segments):
        raise ValueError(
            f"rollout {rollout}: a segment has no reward (tinker-cookbook's advantages are "
            "rewards centred in their group: finalize the session with one)"
        )
    if len(known) > 1:
        raise ValueError(f"rollout {rollout}: its segments differ in reward ({sorted(known)})")
    return known.pop()

"""Segments → the fields of slime (THUDM/slime) and miles (radixark/miles) ``Sample``s
(``slime/utils/types.py``, ``miles/utils/types.py``), grouped per prompt as a rollout function
returns them (``RolloutFnTrainOutput.samples: list[list[Sample]]``, ``rollout/base_types.py``).
Sources read: slime 624b824a898ab0ec1fcb4d373004c7f3852bf515, miles
31f1ca961a94cb860cec3b2dea34ec332bfa8f76; "slime:"/"miles:" below are files there.

Invariants:
- ``tokens`` is the whole segment and the response its last ``response_length`` tokens, so
  ``loss_mask`` and ``rollout_log_probs`` have ``response_length`` entries, as both require.
- ``Sample(**fields)`` is a sample their trainers read as meant:
  - ``status`` is the member of the ``Sample.Status`` passed in, the enum they compare with
    (``sample.status == Sample.Status.TRUNCATED`` makes ``train_data["truncated"]``: slime:
    ray/rollout.py:664, miles: ray/rollout/train_data_conversion.py:80), set from the last
    step's finish reason as their ``append_response_tokens`` sets it (slime:
    utils/types.py:410-416): ``length`` → TRUNCATED, ``abort`` → ABORTED, else COMPLETED.
  - ``reward`` is what ``Sample.get_reward_value(args)`` reads (slime: utils/types.py:246,
    miles: utils/types.py:177): ``reward if not args.reward_key else reward[args.reward_key]``,
    a number then fed to ``torch.tensor``. So with no ``reward_key`` it is the segment's
    reward, with one the dict of its named components, which must hold that key; a segment
    without it is refused (ValueError) rather than crash their reward processing.
  - Groups and rollouts are numbered, not positional: ``group_index`` per instance (the
    prompt), ``index`` per sample, ``rollout_id`` per rollout (the segment's ``rollout_id``,
    else its session), as their data source numbers them (slime: rollout/data_source.py:
    108-116). miles groups the rewards by ``group_index`` and counts one reward per
    ``rollout_id`` (train_data_conversion.py:172-254), and both count a rollout's loss once
    across the samples sharing a ``rollout_id`` (slime: ray/rollout.py:647-656 and 695-700,
    miles: train_data_conversion.py:82-101): a session of several segments is one rollout.
    slime's default reward normalization is positional instead (ray/rollout.py:608-634: groups
    of ``n_samples_per_prompt`` only when the batch holds exactly ``n_samples_per_prompt *
    rollout_batch_size`` samples, else one batch-wide group), so for slime pass
    ``--custom-reward-post-process-path titoflow.client.formats.slime.group_normalized_rewards``.
- ``rollout_log_probs`` are what their trainer's forward computes, ``log_softmax(logits / T)``
  at ``--rollout-temperature`` with no cut (slime: backends/megatron_utils/loss.py:133, miles:
  backends/training_utils/loss_hub/logit_processors.py:55), or the segment is refused.
- Unused samples (nobody continued them; the reward was not earned through them) are left out.

Images: given the image store, a segment with images also gets ``multimodal_train_inputs``,
``pixel_values`` and ``image_grid_thw`` of its images in token order
(:func:`~titoflow.client.image_inputs.image_inputs`) as torch tensors: both move each value
with ``.to(device)`` and ``torch.cat`` them per key across samples for the forward pass (slime:
backends/megatron_utils/actor.py:270-282 and data.py:137-147; miles:
backends/training_utils/data.py:67-75 and 329-347), which numpy arrays cannot go through.
torch is imported only then (their processes have it; titoflow does not need it). A segment
with images and no store raises ValueError. ``multimodal_inputs`` (the raw images) is not
filled.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from enum import Enum
from typing import Any

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays, group_by_instance, rollout_key
from titoflow.client.formats.common import (
    prompt_length,
    refuse_images,
    refuse_other_policies,
    truncated,
    versions,
)
from titoflow.image_store import ImageStore

_ABORTED = frozenset({"abort", "aborted"})
# slime: ray/rollout.py:614 and 627, the estimators whose rewards it centers per group and scales.
_CENTERED = frozenset({"grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"})
_SCALED = frozenset({"grpo", "gspo", "cispo"})


def to_slime(
    segments: Sequence[SegmentFinalized],
    status: type[Enum],
    *,
    reward_key: str | None = None,
    temperature: float = 1.0,
    image_store: ImageStore | None = None,
) -> list[list[dict[str, Any]]]:
    """``Sample`` keyword arguments, one list per instance (prompt) in arrival order.

    ``status``: ``Sample.Status`` (``from slime.utils.types import Sample``, or miles'), so
    ``Sample(**fields)`` takes the fields as they are. ``reward_key`` and ``temperature``:
    ``args.reward_key`` and ``args.rollout_temperature``. ``image_store``: the store the
    ingress wrote the images to, for ``multimodal_train_inputs``."""
    used = [segment for segment in segments if not segment.unused_sample]
    if not used:
        raise ValueError("no segments to convert")
    if image_store is None:
        refuse_images(used, "pass to_slime(..., image_store=) to carry their pixels")
    rollouts: dict[str, int] = {}
    out: list[list[dict[str, Any]]] = []
    index = 0
    for group_index, group in enumerate(group_by_instance(used).values()):
        samples = []
        for segment in group:
            refuse_other_policies(segment, temperature, "slime")
            rollout = rollouts.setdefault(rollout_key(segment), len(rollouts))
            fields = _fields(segment, status, reward_key, image_store)
            samples.append(
                {**fields, "group_index": group_index, "index": index, "rollout_id": rollout}
            )
            index += 1
        out.append(samples)
    return out


def _fields(
    segment: SegmentFinalized,
    status: type[Enum],
    reward_key: str | None,
    image_store: ImageStore | None,
) -> dict[str, Any]:
    ids, mask, logprobs = aligned_arrays(segment)
    split = prompt_length(segment)
    last = segment.steps[-1].finish_reason if segment.steps else ""
    state = "truncated" if truncated(segment) else "aborted" if last in _ABORTED else "completed"
    fields: dict[str, Any] = {
        "tokens": ids.tolist(),
        "response_length": len(ids) - split,
        "loss_mask": mask[split:].tolist(),
        "rollout_log_probs": logprobs[split:].tolist(),
        "reward": _reward(segment, reward_key),
        "status": status(state),
        "weight_versions": versions(segment),
        # miles' Sample has no session_id (slime's routes requests by it): the ids ride in
        # metadata for both.
        "metadata": {
            **segment.metadata,
            "segment_id": segment.segment_id,
            "session_id": segment.session_id,
            "instance_id": segment.instance_id,
        },
    }
    if segment.images and image_store is not None:
        # Here, not at the top: titoflow's torch is an extra (torch_data holds its one import);
        # slime's and miles' processes have it.
        from titoflow.client.torch_data import image_tensors

        fields["multimodal_train_inputs"] = image_tensors(segment, image_store)
    return fields


def _reward(segment: SegmentFinalized, reward_key: str | None) -> float | dict[str, float]:
    """What ``get_reward_value`` reads a number from, or ValueError naming what to pass."""
    components = sorted(segment.reward_components)
    if reward_key is not None:
        if reward_key not in segment.reward_components:
            raise ValueError(
                f"segment {segment.segment_id} has no reward component {reward_key!r} "
                f"(it has {components}): slime and miles read reward[args.reward_key]"
            )
        return dict(segment.reward_components)
    if segment.reward is None:
        hint = (
            f"pass reward_key= one of its components {components} (--reward-key)"
            if components
            else "finalize the session with a reward, or score it before converting"
        )
        raise ValueError(
            f"segment {segment.segment_id} has no reward, and slime and miles train on a "
            f"number per sample: {hint}"
        )
    return segment.reward


def group_normalized_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """slime's ``--custom-reward-post-process-path``: ``(raw_rewards, rewards)`` as its
    ``_post_process_rewards`` returns them (slime: ray/rollout.py:608-634), centered (and for
    GRPO-like estimators scaled) per ``group_index`` rather than per position, with one reward
    per ``rollout_id`` as miles counts them (train_data_conversion.py:207-254), so uneven groups
    and sessions of several segments are weighted as rollouts. A group of one rollout is only
    centered (its standard deviation is undefined)."""
    raw = [sample.get_reward_value(args) for sample in samples]
    if args.advantage_estimator not in _CENTERED or not args.rewards_normalization:
        return raw, raw
    scaled = args.advantage_estimator in _SCALED and args.grpo_std_normalization
    groups: dict[int, dict[int, list[int]]] = {}
    for row, sample in enumerate(samples):
        if sample.group_index is None or sample.rollout_id is None:
            raise ValueError(
                f"sample {row} has no group_index or rollout_id: make it with to_slime"
            )
        groups.setdefault(sample.group_index, {}).setdefault(sample.rollout_id, []).append(row)
    out = [0.0] * len(samples)
    for rollouts in groups.values():
        shared = []
        for rollout_id, rows in rollouts.items():
            if len({raw[row] for row in rows}) > 1:
                raise ValueError(f"the samples of rollout {rollout_id} differ in reward")
            shared.append(float(raw[rows[0]]))
        mean = statistics.fmean(shared)
        scale = statistics.stdev(shared) + 1e-6 if scaled and len(shared) > 1 else 1.0
        for rows, reward in zip(rollouts.values(), shared, strict=True):
            for row in rows:
                out[row] = (reward - mean) / scale
    return raw, out

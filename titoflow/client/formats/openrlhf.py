"""Segments → OpenRLHF ``Experience``s (``openrlhf/trainer/ppo_utils/experience.py``), one per
sample, as its agent path makes one from a rollout (``samples_generator.py``,
``_process_response_into_experience``), for its experience maker and PPO trainer (0.11.x).

Invariants:
- One sample is one ``Experience`` of batch size 1: ``sequences`` and ``attention_mask`` are
  ``[1, T]`` (unpadded: OpenRLHF pads when it concatenates samples); the action arrays are
  ``[1, T - 1]``, position ``t`` for the token at ``t + 1`` (the one the logits at ``t``
  predict), as OpenRLHF shifts them.
- Groups are positional in OpenRLHF: its experience maker numbers the samples in order and
  takes each ``n_samples_per_prompt`` consecutive ones as one prompt's group. So samples come
  group by group (by instance, :func:`~titoflow.client.batch.group_by_instance`), ``index`` is
  that position, and a group of another size than ``n_samples_per_prompt`` is refused: it
  would be cut across prompts silently, or crash the group reshape.
- ``rewards`` and ``info["reward"]`` (what its trainer logs) are the segment's reward; with no
  reward on any segment both are left out (OpenRLHF's reward model scores them), and a mix is
  refused.
- ``rollout_log_probs`` are what OpenRLHF's ``Actor`` computes, ``log_softmax(logits / T)`` at
  its temperature with no cut, or the segment is refused (as for TRL).
- Unused samples (nobody continued them; the reward was not earned through them) are left out.
- ``mm_train_inputs`` is ``[inputs]`` per sample as its agent path sets it (``[None]`` for a
  text sample; ``concat_experiences`` chains the lists and ``split_experience_batch`` takes
  entry ``i`` for sample ``i`` only when there is one entry per sample, so no sample lacks it).
  Given the image store, ``inputs`` of a segment with images is the processor output its VLM
  ``Actor`` takes (``merge_mm_train_inputs`` ``torch.cat``s each key across samples, in batch
  order): ``pixel_values`` and ``image_grid_thw`` of its images in token order, checked against
  the recorded runs (:func:`~titoflow.client.image_inputs.image_inputs`), as torch tensors, as
  its processor returns them (``return_tensors="pt"``; torch is imported only then). Its
  ``mm_token_type_ids`` it rebuilds from ``sequences`` itself. A segment with images and no
  store raises ValueError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays, group_by_instance
from titoflow.client.formats.common import refuse_images, refuse_other_policies, truncated
from titoflow.image_store import ImageStore


def to_openrlhf(
    segments: Sequence[SegmentFinalized],
    n_samples_per_prompt: int,
    temperature: float = 1.0,
    image_store: ImageStore | None = None,
) -> list[dict[str, Any]]:
    """The fields of one ``Experience`` per trajectory segment, ordered group by group;
    ``n_samples_per_prompt`` and ``temperature``: OpenRLHF's (``--rollout.*``).
    ``image_store``: the store the ingress wrote the images to, for ``mm_train_inputs``."""
    used = [segment for segment in segments if not segment.unused_sample]
    if not used:
        raise ValueError("no segments to convert")
    if image_store is None:
        refuse_images(used, "pass to_openrlhf(..., image_store=) to carry their pixels")
    rewarded = [segment.reward is not None for segment in used]
    if any(rewarded) and not all(rewarded):
        raise ValueError(
            "some segments have a reward and others none: OpenRLHF takes all rewards given, "
            "or scores all samples with its reward model"
        )
    groups = group_by_instance(used)
    for instance, group in groups.items():
        if len(group) != n_samples_per_prompt:
            raise ValueError(
                f"instance {instance} has {len(group)} samples: OpenRLHF groups "
                f"n_samples_per_prompt={n_samples_per_prompt} consecutive samples as one prompt's"
            )
    out: list[dict[str, Any]] = []
    for segment in (segment for group in groups.values() for segment in group):
        refuse_other_policies(segment, temperature, "OpenRLHF")
        ids, mask, logprobs = aligned_arrays(segment)
        actions = np.flatnonzero(mask)
        fields: dict[str, Any] = {
            "sequences": ids.astype(np.int64)[None],
            "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
            "action_mask": mask[None, 1:].astype(bool),
            "rollout_log_probs": logprobs[None, 1:],
            # OpenRLHF's: the span from the first action token to the last.
            "response_length": np.array(
                [actions[-1] - actions[0] + 1 if len(actions) else 0], dtype=np.int64
            ),
            "truncated": np.array([truncated(segment)], dtype=bool),
            "total_length": np.array([len(ids)], dtype=np.float32),
            "index": [len(out)],
            "mm_train_inputs": [_mm_train_inputs(segment, image_store)],
            "info": {},
        }
        if segment.reward is not None:
            fields["rewards"] = np.array([segment.reward], dtype=np.float32)
            fields["info"]["reward"] = fields["rewards"].copy()
        out.append(fields)
    return out


def _mm_train_inputs(segment: SegmentFinalized, store: ImageStore | None) -> dict[str, Any] | None:
    if not segment.images or store is None:
        return None
    # Here, not at the top: titoflow's torch is an extra (torch_data holds its one import);
    # OpenRLHF's processes have it.
    from titoflow.client.torch_data import image_tensors

    return image_tensors(segment, store)

"""Segments → a verl ``DataProto``'s ``batch``, ``non_tensor_batch`` and ``meta_info``, as verl's
agent loop hands a rollout to its trainer (``verl/experimental/agent_loop/agent_loop.py``,
``_postprocess``) and its trainer hands it on to the actor (``verl/trainer/ppo/ray_trainer.py``,
``fit``); verl's own ``DataParallelPPOActor`` and GRPO advantage run on it
(tests/trainers/test_trainer_verl.py).

Invariant: ``input_ids`` is ``prompts`` (left-padded to one length) followed by ``responses``
(right-padded), every ``[batch, ...]`` array aligned to it as verl aligns them; the reward sits
on the last real response token of ``rm_scores``. Every key verl's trainer and actor read
unconditionally is there: ``multi_modal_inputs`` on every row (``{}`` for a text row, as its
agent loop makes it), ``uid`` as verl makes it (a UUID string per prompt, shared by that
prompt's rollouts: here derived from the instance), and ``meta_info``'s ``temperature`` (the
actor divides the logits by it) and ``global_token_num`` (its FSDP worker's token count). The
recorded logprobs are what verl's actor computes at that temperature, ``log_softmax(logits /
T)`` with no cut, or the segment is refused. Build the ``DataProto`` with
``DataProto.from_dict(tensors={k: torch.from_numpy(v) for k, v in batch.batch.items()},
non_tensors=batch.non_tensor_batch, meta_info=batch.meta_info)``.

Images: given the image store, ``non_tensor_batch["multi_modal_inputs"]`` holds per row the
dict verl's agent loop puts there (``_compute_multi_modal_inputs``, collected by
``_postprocess`` as ``np.array(list_of_dicts, dtype=object)``; the actor concatenates the rows'
values with ``verl/utils/model.py`` ``extract_multi_modal_inputs``): ``pixel_values``,
``image_grid_thw`` and ``images_seqlens`` (``repeat_interleave(h * w, t)`` per image), the
segment's images in token order (:func:`~titoflow.client.image_inputs.image_inputs`, checked
against the recorded runs); numpy here, torch tensors in verl (``torch.from_numpy`` each
value). ``position_ids`` are what verl's agent loop makes for the model (``_compute_position_ids``):
for a text model (no processor) ``[B, P + R]``, ``compute_position_id_with_mask``; for a
Qwen2/2.5/3-VL policy (``mrope=True``: verl loads its processor) ``[B, 4, P + R]`` on every row,
text positions (0, 1, ... over the real tokens) then M-RoPE's time, height and width rows (the
model's ``get_rope_index``: :func:`~titoflow.client.mrope.mrope_position_ids`), 1 on padding as
there. Segments with images and no store, or without ``mrope=True``, raise ValueError: as text
positions a Qwen2/2.5-VL actor raises and a Qwen3-VL one trains on wrong image positions.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays, instance_key
from titoflow.client.formats.common import prompt_length, refuse_images, refuse_other_policies
from titoflow.client.image_inputs import image_inputs
from titoflow.client.mrope import mrope_position_ids
from titoflow.image_store import ImageStore

# uid: verl draws a uuid4 per prompt; a name-based UUID of the instance groups the same rollouts
# and is the same each time the segments are converted.
UID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "titoflow:instance")


@dataclass
class VerlBatch:
    """``batch`` (the tensors, as numpy), ``non_tensor_batch`` (object arrays), ``meta_info``."""

    batch: dict[str, np.ndarray]
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, object] = field(default_factory=dict)


def to_verl(
    segments: Sequence[SegmentFinalized],
    pad_id: int,
    prompt_length_to: int | None = None,
    response_length_to: int | None = None,
    image_store: ImageStore | None = None,
    temperature: float = 1.0,
    mrope: bool = False,
) -> VerlBatch:
    """The batch of ``segments``: prompts padded to ``prompt_length_to`` and responses to
    ``response_length_to`` (verl's ``rollout.prompt_length`` / ``response_length``; default:
    the longest). A segment longer than either raises ValueError (nothing is cut).
    ``image_store``: the store the ingress wrote the images to, for ``multi_modal_inputs``.
    ``temperature``: verl's ``rollout.temperature``, what its actor divides the logits by.
    ``mrope``: the policy is a Qwen2/2.5/3-VL model, whose ``position_ids`` are M-RoPE's."""
    if not segments:
        raise ValueError("no segments to batch")
    if image_store is None or not mrope:
        refuse_images(
            segments,
            "pass to_verl(..., image_store=, mrope=True) for a Qwen-VL policy's pixels and "
            "M-RoPE position_ids",
        )
    for segment in segments:
        refuse_other_policies(segment, temperature, "verl")
    arrays = [aligned_arrays(segment) for segment in segments]
    splits = [prompt_length(segment) for segment in segments]
    longest_prompt = max(splits)
    longest_response = max(
        len(ids) - split for (ids, _, _), split in zip(arrays, splits, strict=True)
    )
    p = longest_prompt if prompt_length_to is None else prompt_length_to
    r = longest_response if response_length_to is None else response_length_to
    if longest_prompt > p or longest_response > r:
        raise ValueError(
            f"a segment has a prompt of {longest_prompt} or a response of {longest_response} "
            f"tokens, more than {p} / {r}"
        )
    size = len(segments)
    prompts = np.full((size, p), pad_id, dtype=np.int64)
    responses = np.full((size, r), pad_id, dtype=np.int64)
    prompt_attention = np.zeros((size, p), dtype=np.int64)
    response_attention = np.zeros((size, r), dtype=np.int64)
    response_mask = np.zeros((size, r), dtype=np.int64)
    rollout_log_probs = np.zeros((size, r), dtype=np.float32)
    rm_scores = np.zeros((size, r), dtype=np.float32)
    for row, ((ids, mask, logprobs), split, segment) in enumerate(
        zip(arrays, splits, segments, strict=True)
    ):
        n = len(ids) - split
        prompts[row, p - split :] = ids[:split]
        prompt_attention[row, p - split :] = 1
        responses[row, :n] = ids[split:]
        response_attention[row, :n] = 1
        response_mask[row, :n] = mask[split:]
        rollout_log_probs[row, :n] = logprobs[split:]
        if segment.reward is not None and n > 0:
            rm_scores[row, n - 1] = segment.reward
    attention_mask = np.concatenate([prompt_attention, response_attention], axis=1)
    # First: each image checked against its pixels (ImageMismatch) before its positions are laid.
    rows = [_multi_modal_inputs(segment, image_store) for segment in segments]
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention_mask,
        "position_ids": (
            _mrope_positions(segments, [p - split for split in splits], p + r)
            if mrope
            # verl's compute_position_id_with_mask: 0 on left padding, then 0, 1, 2...
            else np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)
        ),
        "rollout_log_probs": rollout_log_probs,
    }
    if all(segment.reward is not None for segment in segments):
        batch["rm_scores"] = rm_scores
    non_tensor_batch = {
        # GRPO groups rollouts by uid: the prompt each segment samples.
        "uid": _objects([uid(segment) for segment in segments]),
        "segment_id": _objects([segment.segment_id for segment in segments]),
        "multi_modal_inputs": _objects(rows),
    }
    meta_info: dict[str, object] = {
        "temperature": temperature,
        "global_token_num": attention_mask.sum(axis=1).tolist(),
        # As verl's trainer collects them for its FLOPs count: every image's patches, in order.
        "images_seqlens": [int(n) for row in rows for n in row.get("images_seqlens", ())],
    }
    return VerlBatch(batch, non_tensor_batch, meta_info)


def uid(segment: SegmentFinalized) -> str:
    """verl's ``uid`` of the segment: a UUID string, one per prompt (:func:`instance_key`)."""
    return str(uuid.uuid5(UID_NAMESPACE, instance_key(segment)))


def _mrope_positions(
    segments: Sequence[SegmentFinalized], starts: Sequence[int], width: int
) -> np.ndarray:
    """``[B, 4, width]``: each row's tokens, from its ``start``, hold its text positions then
    its M-RoPE rows; padding holds 1 in all four, as verl's agent loop leaves it."""
    positions = np.ones((len(segments), 4, width), dtype=np.int64)
    for row, (segment, start) in enumerate(zip(segments, starts, strict=True)):
        size = len(segment.token_ids)
        positions[row, 0, start : start + size] = np.arange(size)
        positions[row, 1:, start : start + size] = mrope_position_ids(segment)
    return positions


def _multi_modal_inputs(
    segment: SegmentFinalized, store: ImageStore | None
) -> dict[str, np.ndarray]:
    if not segment.images or store is None:
        return {}
    inputs = image_inputs(segment, store)
    grid = inputs.image_grid_thw
    return {
        "pixel_values": inputs.pixel_values,
        "image_grid_thw": grid,
        "images_seqlens": np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0]),
    }


def _objects(values: Sequence[object]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array

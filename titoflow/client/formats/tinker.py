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

Images (given the image store), as tinker-cookbook's Qwen-VL renderer lays them out
(``renderers/qwen3.py``, ``image_to_chunk`` in ``renderers/base.py``): each image's run of
placeholder ids becomes one ``image`` chunk in its place, ``expected_tokens`` its run length, the
text around it (``<|vision_start|>``, ``<|vision_end|>`` included) ``encoded_text`` chunks. So
``model_input``'s length, text tokens plus image chunks' ``expected_tokens``, stays the tokens
but the last, and the ``loss_fn_inputs`` keep their alignment; a target inside an image is 0, as
cookbook's ``create_rightshifted_model_input_and_leftshifted_targets`` sets it (its loss mask is
0). Each image is checked against its recorded run first
(:func:`~titoflow.client.image_inputs.image_inputs`). Its ``data`` are the bytes the store holds
when they are a PNG or JPEG already upright (Tinker takes no other ``format``); otherwise the
pixels the engine's processor took (turned upright by their EXIF orientation, RGB) as a PNG, so
that Tinker sees what the engine saw whether or not it reads EXIF. A segment with images and no
store raises ValueError, as does one whose last token is an image's (cookbook's too: the last
chunk must be text).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from schemas.events import SegmentFinalized
from schemas.images import ImageRecord
from titoflow.client.batch import aligned_arrays, group_by_instance, rollout_key
from titoflow.client.formats.common import refuse_images, refuse_other_policies
from titoflow.client.image_inputs import image_inputs
from titoflow.image_store import ImageStore

_ORIENTATION = 0x0112  # the EXIF tag vLLM's exif_transpose turns the image by
_FORMATS = {"PNG": "png", "JPEG": "jpeg"}  # PIL's name → ImageChunk's


def to_tinker(
    segment: SegmentFinalized,
    advantage: float | None = None,
    image_store: ImageStore | None = None,
) -> dict[str, Any]:
    """``model_input`` as ``ModelInput``'s fields (``encoded_text`` chunks, and an ``image``
    chunk per image) and ``loss_fn_inputs`` as numpy arrays (int64 targets, float32 others:
    Tinker's dtypes). ``advantage`` is the segment's (e.g. group-relative), put on its generated
    tokens. ``image_store``: the store the ingress wrote the images to, for the image chunks."""
    if image_store is None:
        refuse_images([segment], "pass to_tinker(..., image_store=) for Tinker's image chunks")
    ids, mask, logprobs = aligned_arrays(segment)
    if len(ids) < 2:
        raise ValueError(f"segment {segment.segment_id}: fewer than 2 tokens, nothing to predict")
    images: list[tuple[ImageRecord, tuple[bytes, str]]] = []
    if image_store is not None:
        records = image_inputs(segment, image_store).records  # checked against their runs
        images = [(r, _image_bytes(image_store.get(r.sha256))) for r in records]
    targets = ids[1:].astype(np.int64)
    for record, _ in images:
        if record.offset + record.length == len(ids):
            raise ValueError(
                f"segment {segment.segment_id} ends in image {record.sha256}: Tinker's input is "
                "the tokens but the last, and an image chunk is not cut"
            )
        targets[max(record.offset - 1, 0) : record.offset + record.length - 1] = 0
    weights = mask[1:].astype(np.float32)
    inputs: dict[str, np.ndarray] = {"target_tokens": targets}
    if advantage is None:
        inputs["weights"] = weights
    else:
        refuse_other_policies(segment, 1.0, "Tinker")
        inputs["logprobs"] = logprobs[1:]
        # 0.0 off the mask, not advantage × 0 (-0.0 for a negative one), as cookbook builds it.
        inputs["advantages"] = np.where(mask[1:] > 0, np.float32(advantage), np.float32(0.0))
        inputs["mask"] = weights
    return {
        "model_input": {"chunks": _chunks(ids[:-1].tolist(), images)},
        "loss_fn_inputs": inputs,
    }


def _chunks(
    ids: list[int], images: Sequence[tuple[ImageRecord, tuple[bytes, str]]]
) -> list[dict[str, Any]]:
    """``ids`` as ``ModelInput`` chunks: each image's run (``images`` in token order, with their
    bytes and format) one image chunk, the text between them ``encoded_text`` chunks (none
    empty)."""
    chunks: list[dict[str, Any]] = []
    start = 0
    for record, (data, kind) in images:
        if record.offset > start:
            chunks.append({"type": "encoded_text", "tokens": ids[start : record.offset]})
        chunks.append(
            {"type": "image", "data": data, "format": kind, "expected_tokens": record.length}
        )
        start = record.offset + record.length
    if start < len(ids):
        chunks.append({"type": "encoded_text", "tokens": ids[start:]})
    return chunks


def _image_bytes(data: bytes) -> tuple[bytes, str]:
    """An image as Tinker takes it: ``(bytes, format)``, the stored bytes where they are an
    upright PNG or JPEG, else the engine's upright RGB pixels as a PNG."""
    with Image.open(io.BytesIO(data)) as image:
        kind = _FORMATS.get(image.format or "")
        if kind is not None and image.getexif().get(_ORIENTATION, 1) == 1:
            return data, kind
        upright = ImageOps.exif_transpose(image).convert("RGB")
    out = io.BytesIO()
    upright.save(out, format="PNG")
    return out.getvalue(), "png"


def to_tinker_batch(
    segments: Sequence[SegmentFinalized], image_store: ImageStore | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, int]]]:
    """``(data, metadata)`` as ``assemble_training_data`` returns them: one datum per segment,
    group by group (instances, in arrival order), each with its trajectory's advantage (its
    reward minus its group's mean over trajectories, ``compute_advantages``), and per datum its
    ``group_idx`` and ``traj_idx`` (the rollout: ``rollout_id``, else the session). Unused
    samples are left out; a segment without a reward, or a rollout whose segments differ in
    reward, raises ``ValueError``. ``image_store``: as for :func:`to_tinker`."""
    data: list[dict[str, Any]] = []
    metadata: list[dict[str, int]] = []
    used = [segment for segment in segments if not segment.unused_sample]
    for group_idx, group in enumerate(group_by_instance(used).values()):
        rollouts: dict[str, list[SegmentFinalized]] = {}
        for segment in group:
            rollouts.setdefault(rollout_key(segment), []).append(segment)
        rewards = [_reward(key, found) for key, found in rollouts.items()]
        mean = np.mean(np.asarray(rewards, np.float32))  # float32, as compute_advantages' tensor
        for traj_idx, (found, reward) in enumerate(zip(rollouts.values(), rewards, strict=True)):
            advantage = float(np.float32(reward) - mean)
            for segment in found:
                data.append(to_tinker(segment, advantage, image_store))
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

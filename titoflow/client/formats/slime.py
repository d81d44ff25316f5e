"""A segment → the fields of a slime (THUDM/slime) or miles (radixark/miles) ``Sample``
(``slime/utils/types.py``, ``miles/utils/types.py``).

Invariant: ``tokens`` is the whole segment and the response its last ``response_length``
tokens, so ``loss_mask`` and ``rollout_log_probs`` have ``response_length`` entries, as both
frameworks require. Build one with ``Sample(**fields, status=Sample.Status(fields["status"]))``
(``status`` is the enum's value here, a plain string).

Images: given the image store, a segment with images also gets ``multimodal_train_inputs``,
the field both ``Sample`` classes define for the processed inputs ("processed multimodal data,
e.g. pixel_values"; slime's ``sglang_rollout.py`` fills it with the processor's output but its
ids, ``data.py`` concatenates the samples' values per key for the forward pass):
``pixel_values`` and ``image_grid_thw`` of its images in token order
(:func:`~titoflow.client.image_inputs.image_inputs`, checked against the recorded runs), numpy
here (``torch.from_numpy`` each value for slime). ``multimodal_inputs`` (the raw images) is not
filled. A segment with images and no store raises ValueError.
"""

from __future__ import annotations

from typing import Any

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays
from titoflow.client.formats.common import prompt_length, refuse_images, truncated, versions
from titoflow.client.image_inputs import image_inputs
from titoflow.image_store import ImageStore

# A segment ends at a finish reason of its last step; Sample.Status has no "stopped for a tool".
_ABORTED = frozenset({"abort", "aborted"})


def to_slime(segment: SegmentFinalized, image_store: ImageStore | None = None) -> dict[str, Any]:
    """``Sample`` keyword arguments; ``reward`` is the scalar reward, else the named components
    (a dict, as ``Sample.reward`` allows), else None. ``image_store``: the store the ingress
    wrote the images to, for ``multimodal_train_inputs``."""
    if image_store is None:
        refuse_images([segment], "pass to_slime(..., image_store=) to carry their pixels")
    ids, mask, logprobs = aligned_arrays(segment)
    split = prompt_length(segment)
    last = segment.steps[-1].finish_reason if segment.steps else ""
    status = "truncated" if truncated(segment) else "aborted" if last in _ABORTED else "completed"
    reward: float | dict[str, float] | None = segment.reward
    if reward is None and segment.reward_components:
        reward = dict(segment.reward_components)
    fields: dict[str, Any] = {
        "tokens": ids.tolist(),
        "response_length": len(ids) - split,
        "loss_mask": mask[split:].tolist(),
        "rollout_log_probs": logprobs[split:].tolist(),
        "reward": reward,
        "status": status,
        "weight_versions": versions(segment),
        # miles' Sample has no session_id (slime's does): the ids ride in metadata for both.
        "metadata": {
            **segment.metadata,
            "segment_id": segment.segment_id,
            "session_id": segment.session_id,
            "instance_id": segment.instance_id,
        },
    }
    if segment.images and image_store is not None:
        inputs = image_inputs(segment, image_store)
        fields["multimodal_train_inputs"] = {
            "pixel_values": inputs.pixel_values,
            "image_grid_thw": inputs.image_grid_thw,
        }
    return fields

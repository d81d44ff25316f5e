"""A segment → the fields of a slime (THUDM/slime) or miles (radixark/miles) ``Sample``
(``slime/utils/types.py``, ``miles/utils/types.py``).

Invariant: ``tokens`` is the whole segment and the response its last ``response_length``
tokens, so ``loss_mask`` and ``rollout_log_probs`` have ``response_length`` entries, as both
frameworks require. Build one with ``Sample(**fields, status=Sample.Status(fields["status"]))``
(``status`` is the enum's value here, a plain string).
"""

from __future__ import annotations

from typing import Any

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays
from titoflow.client.formats.common import prompt_length, truncated, versions

# A segment ends at a finish reason of its last step; Sample.Status has no "stopped for a tool".
_ABORTED = frozenset({"abort", "aborted"})


def to_slime(segment: SegmentFinalized) -> dict[str, Any]:
    """``Sample`` keyword arguments; ``reward`` is the scalar reward, else the named components
    (a dict, as ``Sample.reward`` allows), else None."""
    ids, mask, logprobs = aligned_arrays(segment)
    split = prompt_length(segment)
    last = segment.steps[-1].finish_reason if segment.steps else ""
    status = "truncated" if truncated(segment) else "aborted" if last in _ABORTED else "completed"
    reward: float | dict[str, float] | None = segment.reward
    if reward is None and segment.reward_components:
        reward = dict(segment.reward_components)
    return {
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

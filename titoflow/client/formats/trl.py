"""Rollouts → what TRL's ``GRPOTrainer(rollout_func=…)`` takes from a rollout function
(huggingface/trl, ``trl/trainer/grpo_trainer.py``): ``prompt_ids``, ``completion_ids``,
``logprobs`` and ``env_mask``, one entry per rollout.

Invariants:
- One rollout is one entry: a session's trajectory segment (its ``unused_sample`` segments are
  left out: nobody continued them, and the session's reward was not earned through them). A
  session of several trajectory segments (its client rewrote its history) has no single
  completion TRL could train on, and is refused rather than cut.
- The prompt is the tokens before the first generated one; the completion is the rest, the
  tool results and later turns between generated tokens included, with ``env_mask`` 0 on them
  (TRL's own tool loop lays multi-turn samples out so) and 1 on generated tokens, whose
  ``logprobs`` are the engine's; TRL masks the others out of every loss and correction.
- Entries keep the order of the sessions given: TRL groups ``num_generations`` consecutive
  completions as one prompt's group, so give each prompt's sessions together.
- The recorded logprobs are those TRL's forward computes, ``log_softmax(logits / T)`` with its
  ``temperature`` and no cut, or the segment is refused: a step sampled with a top-p, top-k or
  min-p cut, at another temperature, or at T != 1 with raw logprobs (vLLM's default, before
  temperature) would bias every importance ratio silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas.events import SegmentFinalized
from titoflow.client.batch import aligned_arrays
from titoflow.client.formats.common import prompt_length, refuse_images, refuse_other_policies


def trajectory(segments: Sequence[SegmentFinalized]) -> SegmentFinalized:
    """The one trajectory segment among a session's segments."""
    used = [s for s in segments if not s.unused_sample]
    if len(used) != 1:
        session = segments[0].session_id if segments else "?"
        raise ValueError(
            f"session {session} has {len(used)} trajectory segments: TRL trains one completion "
            "per rollout (a session whose client rewrote its history is several)"
        )
    return used[0]


def to_trl(
    sessions: Sequence[Sequence[SegmentFinalized]], temperature: float = 1.0
) -> dict[str, list[Any]]:
    """The rollout function's output for ``sessions`` (each one session's segments, in the
    order TRL groups them); ``temperature``: TRL's (``GRPOConfig.temperature``)."""
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
    out["env_mask"] = []
    for segments in sessions:
        segment = trajectory(segments)
        refuse_images([segment], "to_trl does not carry images")
        refuse_other_policies(segment, temperature, "TRL")
        ids, mask, logprobs = aligned_arrays(segment)
        cut = prompt_length(segment)
        out["prompt_ids"].append(ids[:cut].tolist())
        out["completion_ids"].append(ids[cut:].tolist())
        out["logprobs"].append(logprobs[cut:].tolist())
        out["env_mask"].append(mask[cut:].astype(int).tolist())
    return out

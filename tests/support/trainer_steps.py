"""Each trainer's step on titoflow's data in that trainer's own code, run in its environment
(:func:`tests.support.trainer_rollouts.trainer_step`) by the trainer tests: OpenRLHF's
(tests/support/openrlhf_step.py), tinker-cookbook's (tests/support/tinker_step.py) and verl's
(tests/support/verl_step.py). Each returns what that script computed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas.events import SegmentFinalized
from tests.support.trainer_rollouts import PROMPTS, REWARDS, trainer_step


def openrlhf_step(
    samples: list[dict[str, Any]],
    to_experiences: str,
    model_dir: Path,
    tmp_path: Path,
    temperature: float,
) -> Any:
    """What tests/support/openrlhf_step.py computed in OpenRLHF's code from ``samples`` (made by
    ``to_openrlhf`` at ``temperature``, OpenRLHF's ``--rollout.temperature``)."""
    given = {
        "model": str(model_dir),
        "n_samples_per_prompt": 2,
        "temperature": temperature,
        "pad_token_id": 151643,
        "samples": samples,
        "block": to_experiences,
    }
    return trainer_step(".venv-openrlhf", "openrlhf_step", given, tmp_path)


def trajectory(segments: list[SegmentFinalized], reward: float) -> dict[str, Any]:
    """A session as tinker-cookbook's rollout records it: per step, the prompt the policy saw,
    the tokens it sampled and their logprobs."""
    steps = [
        (
            s.token_ids[: step.completion_start],
            s.token_ids[step.completion_start : step.completion_end],
            s.logprobs[step.completion_start : step.completion_end],
        )
        for s in segments
        for step in s.steps
    ]
    return {"steps": steps, "reward": reward}


def tinker_step(
    sessions: list[list[SegmentFinalized]],
    made: tuple[list[dict[str, Any]], list[dict[str, int]]] | None,
    cookbook_step: str,
    model_dir: Path,
    tmp_path: Path,
    temperature: float,
) -> Any:
    """What tests/support/tinker_step.py computed in tinker-cookbook's code from ``made``
    (``to_tinker_batch``'s, ``None`` where it refused) and ``sessions`` (:data:`PROMPTS` × 2,
    interleaved, sampled at ``temperature``) as cookbook's rollout records them."""
    # The groups cookbook's rollout makes: each prompt's sessions, in open order.
    groups = [
        [trajectory(sessions[i], REWARDS[i]) for i in range(len(sessions)) if i % 2 == g]
        for g in range(len(PROMPTS))
    ]
    data, metadata = made if made is not None else (None, None)
    given = {
        "data": data,
        "metadata": metadata,
        "groups": groups,
        "block": cookbook_step,
        "policy_path": str(model_dir),
        "temperature": temperature,
    }
    return trainer_step(".venv-tinker", "tinker_step", given, tmp_path)


def verl_step(batch: Any, step_block: str, model_dir: Path, tmp_path: Path) -> Any:
    """What tests/support/verl_step.py computed in verl's code from ``batch`` (``to_verl``'s)."""
    handed = {k: getattr(batch, k) for k in ("batch", "non_tensor_batch", "meta_info")}
    given = {"batch": handed, "block": step_block, "policy_path": str(model_dir)}
    return trainer_step(".venv-verl", "verl_step", given, tmp_path)

"""A real PPO step in OpenRLHF's own code on rollouts titoflow recorded (issue 39, OpenRLHF).

Agent sessions run through the stack (openai SDK → ingress → vLLM CPU, the random tiny Qwen3
whose logprobs are far from 0): two prompts, two rollouts each, opened interleaved so that
OpenRLHF's positional groups are right only if the samples come group by group. docs/trainer.md's
blocks (marked ``<!-- tested by tests/trainers/test_trainer_openrlhf.py -->``) run as written: the
first
here (:func:`titoflow.client.formats.openrlhf.to_openrlhf`), the second, which makes OpenRLHF's
``Experience``s, in .venv-openrlhf (scripts/setup-openrlhf.sh, OpenRLHF 0.11.2 on CPU torch) by
tests/support/openrlhf_step.py, fed the samples through a temporary file. There OpenRLHF's
experience
maker runs its ``Actor`` forward and ``compute_advantages_and_returns`` (GRPO's group_norm),
and its trainer's ``training_step`` its ``PolicyLoss`` with the token-level importance-sampling
correction on, backward and an optimizer step. Stubs: ``ray``, ``deepspeed``, ``flash_attn`` and
``peft`` while OpenRLHF imports, and stand-ins for its Ray actor group and DeepSpeed strategy,
only as OpenRLHF's own CPU tests stub them (tests/support/openrlhf_step.py says which).

The train/rollout gap is OpenRLHF's: its ``Actor``'s logprobs of the generated tokens (the
``action_log_probs`` its experience maker computes) against the engine's, and its
``PolicyLoss``'s ``vllm_kl``; on the float32 weights the engine serves, and, reported, with the
bf16 weights its own loader makes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.doc_blocks import blocks_run_by
from tests.support.trainer_rollouts import PROMPTS, rollout_sessions
from tests.support.trainer_steps import openrlhf_step
from tests.support.witness import Witness
from titoflow.client.batch import instance_key
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

# vLLM CPU and torch CPU on the same float32 weights; bf16 rounds each weight to 8 bits.
GAP_BOUND = 1e-3
BF16_GAP_BOUND = 0.2


def group_norm(rewards: list[float]) -> list[float]:
    r = np.asarray(rewards, np.float64)
    return [float(a) for a in (r - r.mean()) / (r.std(ddof=1) + 1e-9)]


async def test_a_ppo_step_in_openrlhf_on_titoflow_rollouts(
    stack_settings: Settings, model_dir: Path, witness: Witness, tmp_path: Path
) -> None:
    sessions = await rollout_sessions(stack_settings, model_dir, tmp_path)
    segments = [s for session in sessions for s in session]
    assert len(segments) == 4 and all(not s.unused_sample for s in segments)

    to_samples, to_experiences = blocks_run_by("tests/trainers/test_trainer_openrlhf.py")
    namespace: dict[str, Any] = {"segments": segments}
    exec(compile(to_samples, "docs/trainer.md", "exec"), namespace)
    samples = namespace["samples"]
    # Group by group, whatever the arrival order: OpenRLHF's groups are positions.
    order = [instance_key(s) for s in segments]
    assert order == PROMPTS * 2  # interleaved as opened
    by_index = {s["index"][0]: s for s in samples}
    assert sorted(by_index) == list(range(4))
    out = openrlhf_step(samples, to_experiences, model_dir, tmp_path, 1.0)

    # Each group's advantages are GRPO's of its own rewards: the groups are the instances.
    tokens = {tuple(s.token_ids): s for s in segments}
    ranked = sorted(out["samples"], key=lambda g: int(g["index"]))
    for group in (ranked[:2], ranked[2:]):
        found = [tokens[tuple(by_index[g["index"]]["sequences"][0].tolist())] for g in group]
        assert len({instance_key(s) for s in found}) == 1
        assert [g["reward"] for g in group] == [s.reward for s in found]
        expected = group_norm([g["reward"] for g in group])
        assert np.allclose([g["advantage"] for g in group], expected, atol=1e-5), group
    assert out["moved"] > 0, "OpenRLHF's optimizer step changed no weight"
    gaps, gaps_bf16 = np.asarray(out["gap_f32"]), np.asarray(out["gap_bf16"])
    generated = sum(int(np.sum(s["action_mask"])) for s in samples)
    assert gaps.size == gaps_bf16.size == generated > 0
    print(
        f"OpenRLHF |train - rollout logprob|: float32 mean {gaps.mean():.3g}, max "
        f"{gaps.max():.3g}; bf16 mean {gaps_bf16.mean():.3g}, max {gaps_bf16.max():.3g} "
        f"({gaps.size} tokens); vllm_kl {out['vllm_kl']:.3g}, "
        f"is_filter_ratio {out['is_filter_ratio']:.3g}"
    )
    assert gaps.mean() < GAP_BOUND and abs(out["vllm_kl"]) < GAP_BOUND
    assert out["is_filter_ratio"] == 0.0  # no token outside [0.5, 5] at this gap
    assert gaps_bf16.mean() < BF16_GAP_BOUND

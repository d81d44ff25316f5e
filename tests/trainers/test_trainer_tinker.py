"""A step of tinker-cookbook's own RL loop on rollouts titoflow recorded (issue 39, Tinker).

Agent sessions run through the stack (openai SDK → ingress → vLLM CPU, the random tiny Qwen3
whose logprobs are far from 0): two prompts, two rollouts each, opened interleaved.
docs/trainer.md's blocks (marked ``<!-- tested by tests/trainers/test_trainer_tinker.py -->``) run
as written: the first here (:func:`titoflow.client.formats.tinker.to_tinker_batch`), the second in
.venv-tinker (scripts/setup-tinker.sh, tinker-cookbook 0.6.1 on CPU torch) by
tests/support/tinker_step.py, fed the data through a temporary file. There tinker-cookbook's
``compute_advantages`` and ``assemble_training_data`` make its ``Datum``s from the same sessions
as its rollout records them (one ``Transition`` per step), which must be titoflow's bit for bit;
its ``train_step`` (``importance_sampling``) sends titoflow's to a training client that runs the
service's ``forward_backward`` and ``optim_step`` on the tiny policy with torch (Tinker's service
is remote; that client is the only stand-in), and its ``compute_kl_sample_train`` compares the
training logprobs with the sampled ones.

The train/rollout gap is that forward's (float32, the weights the engine serves) on the
generated tokens against the engine's, and tinker-cookbook's ``optim/kl_sample_train_v1`` /
``_v2`` of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.doc_blocks import blocks_run_by
from tests.support.trainer_rollouts import REWARDS, rollout_sessions
from tests.support.trainer_steps import tinker_step
from tests.support.witness import Witness
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

# vLLM CPU and torch CPU on the same float32 weights.
GAP_BOUND = 1e-3


async def test_a_step_of_tinker_cookbooks_rl_loop_on_titoflow_rollouts(
    stack_settings: Settings, model_dir: Path, witness: Witness, tmp_path: Path
) -> None:
    sessions = await rollout_sessions(stack_settings, model_dir, tmp_path)
    segments = [s for session in sessions for s in session]
    assert len(segments) == 4 and all(not s.unused_sample for s in segments)

    to_data, cookbook_step = blocks_run_by("tests/trainers/test_trainer_tinker.py")
    namespace: dict[str, Any] = {"segments": segments}
    exec(compile(to_data, "docs/trainer.md", "exec"), namespace)
    made = namespace["data"], namespace["metadata"]
    out = tinker_step(sessions, made, cookbook_step, model_dir, tmp_path, 1.0)

    # titoflow's datums and groups are the ones tinker-cookbook makes from the same sessions.
    assert out["differences"] == []
    assert (
        out["metadata"]
        == out["their_metadata"]
        == [{"group_idx": g, "traj_idx": t} for g in range(2) for t in range(2)]
    )
    for g, rewards in enumerate((REWARDS[0::2], REWARDS[1::2])):
        centred = np.asarray(rewards, np.float32) - np.asarray(rewards, np.float32).mean()
        assert out["advantages"][2 * g : 2 * g + 2] == centred.tolist()
    # train_step sent what the loss takes (its own mask dropped) and its step moved the weights.
    assert out["sent"] == ["advantages", "logprobs", "target_tokens"]
    assert out["moved"] > 0, "tinker-cookbook's train_step moved no weight"

    gaps, kl = np.asarray(out["gap"]), out["kl"]
    generated = sum(int(np.sum(s.loss_mask[1:])) for s in segments)
    assert gaps.size == generated > 0
    print(
        f"tinker-cookbook |train - rollout logprob|: float32 mean {gaps.mean():.3g}, max "
        f"{gaps.max():.3g} ({gaps.size} tokens); optim/kl_sample_train_v1 "
        f"{kl['optim/kl_sample_train_v1']:.3g}, _v2 {kl['optim/kl_sample_train_v2']:.3g}"
    )
    assert gaps.mean() < GAP_BOUND
    assert abs(kl["optim/kl_sample_train_v1"]) < GAP_BOUND
    assert kl["optim/kl_sample_train_v2"] < GAP_BOUND**2

"""A real PPO step in verl's own code on rollouts titoflow recorded (issue 39, verl).

Agent sessions run through the stack (openai SDK → ingress → vLLM CPU, the random tiny Qwen3
whose logprobs are far from 0): two prompts, two rollouts each. docs/trainer.md's blocks (marked
``<!-- tested by tests/test_trainer_verl.py -->``) run as written: the first here
(:func:`titoflow.client.formats.verl.to_verl`), the second in .venv-verl (scripts/setup-verl.sh,
verl 0.7.1, the last release with its FSDP ``DataParallelPPOActor``, on CPU torch) by
tests/verl_step.py, fed the batch through a temporary file. There verl's actor computes the
``old_log_probs`` (``compute_log_prob``), its trainer's rollout correction weighs them against
the recorded ones (``compute_rollout_correction_and_add_to_batch``), its GRPO advantage groups
by ``uid`` (``compute_grpo_outcome_advantage``) and ``update_policy`` runs its loss, backward and
optimizer step, in a one-process gloo group as verl's own CPU test of the actor does. Nothing of
verl is stubbed; ray is installed because ``verl.protocol`` imports it, and never started.

The train/rollout gap is verl's: its actor's logprobs of the generated tokens against the
engine's, and its ``rollout_corr/`` metrics (``kl``, ``log_ppl_abs_diff``), on the float32
weights the engine serves; reported, with verl's default bf16 autocast.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.doc_blocks import blocks_run_by
from tests.trainer_rollouts import PROMPTS, rollout_sessions
from tests.witness import Witness
from titoflow.client.batch import instance_key
from titoflow.settings import PROJECT_ROOT, Settings

pytestmark = pytest.mark.engine

PYTHON = PROJECT_ROOT / ".venv-verl" / "bin" / "python"
# vLLM CPU and torch CPU on the same float32 weights; bf16 rounds each weight to 8 bits.
GAP_BOUND = 1e-3
BF16_GAP_BOUND = 0.2


def grpo(rewards: list[float | None]) -> np.ndarray:
    """GRPO's outcome advantage of one group: (r - mean) / (unbiased std + 1e-6)."""
    r = np.asarray(rewards, np.float64)
    advantages: np.ndarray = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    return advantages


async def test_a_ppo_step_in_verl_on_titoflow_rollouts(
    stack_settings: Settings, model_dir: Path, witness: Witness, tmp_path: Path
) -> None:
    sessions = await rollout_sessions(stack_settings, model_dir, tmp_path)
    segments = [s for session in sessions for s in session]
    assert len(segments) == 4 and all(not s.unused_sample for s in segments)

    to_batch, verl_step = blocks_run_by("tests/test_trainer_verl.py")
    namespace: dict[str, Any] = {"segments": segments}
    exec(compile(to_batch, "docs/trainer.md", "exec"), namespace)
    batch = namespace["batch"]
    source, target = tmp_path / "batch.pkl", tmp_path / "verl.json"
    handed = {k: getattr(batch, k) for k in ("batch", "non_tensor_batch", "meta_info")}
    source.write_bytes(
        pickle.dumps({"batch": handed, "block": verl_step, "policy_path": str(model_dir)})
    )
    step = [str(PYTHON), str(PROJECT_ROOT / "tests" / "verl_step.py"), str(source), str(target)]
    run = subprocess.run(step, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    sys.stderr.write(run.stderr[-4000:])
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(target.read_text())

    # verl's GRPO advantage over its uid groups is each instance's own: the uids are the prompts.
    by_id = {s.segment_id: s for s in segments}
    rows = [by_id[segment_id] for segment_id in out["segment_id"]]
    for prompt in PROMPTS:
        group = [i for i, s in enumerate(rows) if instance_key(s) == prompt]
        assert len(group) == 2 and len({out["uid"][i] for i in group}) == 1
        expected = grpo([rows[i].reward for i in group])
        assert np.allclose([out["advantages"][i] for i in group], expected, atol=1e-5)
    assert out["moved"] > 0, "verl's optimizer step changed no weight"
    assert all(np.isfinite(out["metrics"]["actor/grad_norm"]))

    gaps, gaps_bf16 = np.asarray(out["gap_f32"]), np.asarray(out["gap_bf16"])
    generated = int(batch.batch["response_mask"].sum())
    assert gaps.size == gaps_bf16.size == generated > 0
    corr, trained = out["corr_metrics"], out["metrics"]
    print(
        f"verl |train - rollout logprob|: float32 mean {gaps.mean():.3g}, max {gaps.max():.3g}; "
        f"bf16 mean {gaps_bf16.mean():.3g}, max {gaps_bf16.max():.3g} ({gaps.size} tokens); "
        f"rollout_corr/kl {corr['rollout_corr/kl']:.3g}, rollout_corr/log_ppl_abs_diff "
        f"{corr['rollout_corr/log_ppl_abs_diff']:.3g}, update_policy's rollout_corr/kl "
        f"{trained['rollout_corr/kl']}"
    )
    assert gaps.mean() < GAP_BOUND and gaps_bf16.mean() < BF16_GAP_BOUND
    assert abs(corr["rollout_corr/kl"]) < GAP_BOUND
    assert corr["rollout_corr/log_ppl_abs_diff"] < GAP_BOUND
    # update_policy's own rollout_corr metrics, per micro-batch, before its step moved anything.
    assert all(abs(kl) < GAP_BOUND for kl in trained["rollout_corr/kl"])
    # The token-level importance weights the loss is multiplied by: 1 at this gap.
    assert np.allclose(out["is_weights"], 1.0, atol=1e-2)

"""A real PPO step in verl's own code on rollouts titoflow recorded (issue 39, verl).

Agent sessions run through the stack (openai SDK → ingress → vLLM CPU, the random tiny Qwen3
whose logprobs are far from 0): two prompts, two rollouts each. docs/trainer.md's blocks (marked
``<!-- tested by tests/trainers/test_trainer_verl.py -->``) run as written: the first here
(:func:`titoflow.client.formats.verl.to_verl`), the second in .venv-verl (scripts/setup-verl.sh,
verl 0.7.1, the last release with its FSDP ``DataParallelPPOActor``, on CPU torch) by
tests/support/verl_step.py, fed the batch through a temporary file. There verl's actor computes the
``old_log_probs`` (``compute_log_prob``), its trainer's rollout correction weighs them against
the recorded ones (``compute_rollout_correction_and_add_to_batch``), its GRPO advantage groups
by ``uid`` (``compute_grpo_outcome_advantage``) and ``update_policy`` runs its loss, backward and
optimizer step, in a one-process gloo group as verl's own CPU test of the actor does. Nothing of
verl is stubbed; ray is installed because ``verl.protocol`` imports it, and never started.

The train/rollout gap is verl's: its actor's logprobs of the generated tokens against the
engine's, and its ``rollout_corr/`` metrics (``kl``, ``log_ppl_abs_diff``), on the float32
weights the engine serves; reported, with verl's default bf16 autocast.

The same batch then goes through verl's current release (0.9.1, ``.venv-verl/verl-current``):
docs/trainer.md's block marked ``<!-- run by tests/support/verl_current_step.py -->``, run there,
takes it through the trainer's no-padding TensorDict into verl's FSDP model engine on CPU
(``infer_batch`` for ``old_log_probs``, ``train_batch`` with ``ppo_loss`` and the optimizer
step), with the same rollout correction and GRPO advantage (by its registry); checked as the
0.7.1 step is, and its loss against vanilla PPO's at ratio 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from schemas.events import SegmentFinalized
from tests.support.doc_blocks import blocks_run_by
from tests.support.trainer_rollouts import PROMPTS, rollout_sessions, trainer_step
from tests.support.trainer_steps import verl_step
from tests.support.witness import Witness
from titoflow.client.batch import instance_key
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

# vLLM CPU and torch CPU on the same float32 weights; bf16 rounds each weight to 8 bits.
GAP_BOUND = 1e-3
BF16_GAP_BOUND = 0.2


def verl_current_step(batch: Any, model_dir: Path, tmp_path: Path) -> Any:
    """What tests/support/verl_current_step.py computed in verl 0.9.1's code from ``batch``."""
    (block,) = blocks_run_by("tests/support/verl_current_step.py")
    handed = {k: getattr(batch, k) for k in ("batch", "non_tensor_batch", "meta_info")}
    given = {"batch": handed, "block": block, "policy_path": str(model_dir)}
    return trainer_step(".venv-verl", "verl_current_step", given, tmp_path)


def assert_grpo_by_instance(out: Any, segments: list[SegmentFinalized]) -> None:
    """verl's GRPO advantage over its uid groups is each instance's own: the uids are the
    prompts."""
    by_id = {s.segment_id: s for s in segments}
    rows = [by_id[segment_id] for segment_id in out["segment_id"]]
    for prompt in PROMPTS:
        group = [i for i, s in enumerate(rows) if instance_key(s) == prompt]
        assert len(group) == 2 and len({out["uid"][i] for i in group}) == 1
        expected = grpo([rows[i].reward for i in group])
        assert np.allclose([out["advantages"][i] for i in group], expected, atol=1e-5)


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

    to_batch, step_block = blocks_run_by("tests/trainers/test_trainer_verl.py")
    namespace: dict[str, Any] = {"segments": segments}
    exec(compile(to_batch, "docs/trainer.md", "exec"), namespace)
    batch = namespace["batch"]
    out = verl_step(batch, step_block, model_dir, tmp_path)

    assert_grpo_by_instance(out, segments)
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

    # verl 0.9.1, its model engine, on the same batch.
    current = verl_current_step(batch, model_dir, tmp_path)
    assert_grpo_by_instance(current, segments)
    assert current["moved"] > 0, "verl 0.9.1's optimizer step changed no weight"
    loss = current["metrics"]
    assert np.isfinite(loss["grad_norm"])
    # train_batch's forward before the step is infer_batch's: the PPO ratio is 1 on every token.
    assert abs(loss["actor/ppo_kl"]) < 1e-6 and loss["actor/pg_clipfrac"] == 0
    # So vanilla PPO's loss is -A·w per generated token, over the mini-batch's tokens.
    generated_per_row = batch.batch["response_mask"].sum(axis=1)
    advantages = np.repeat(current["advantages"], generated_per_row)
    weights = np.asarray(current["is_weights"])
    expected_loss = -(advantages * weights).sum() / generated_per_row.sum()
    assert np.isclose(loss["actor/pg_loss"], expected_loss, atol=1e-5)
    gaps, gaps_bf16 = np.asarray(current["gap_f32"]), np.asarray(current["gap_bf16"])
    assert gaps.size == gaps_bf16.size == generated
    corr = current["corr_metrics"]
    print(
        f"verl 0.9.1 engine |train - rollout logprob|: float32 mean {gaps.mean():.3g}, max "
        f"{gaps.max():.3g}; bf16 mean {gaps_bf16.mean():.3g}, max {gaps_bf16.max():.3g}; "
        f"rollout_corr/kl {corr['rollout_corr/kl']:.3g}, rollout_corr/log_ppl_abs_diff "
        f"{corr['rollout_corr/log_ppl_abs_diff']:.3g}; actor/pg_loss {loss['actor/pg_loss']:.4g}"
        f", grad_norm {loss['grad_norm']:.4g}"
    )
    assert gaps.mean() < GAP_BOUND and gaps_bf16.mean() < BF16_GAP_BOUND
    assert abs(corr["rollout_corr/kl"]) < GAP_BOUND
    assert corr["rollout_corr/log_ppl_abs_diff"] < GAP_BOUND
    assert np.allclose(current["is_weights"], 1.0, atol=1e-2)

"""Trainers' forwards at temperature 0.7 against a processed_logprobs engine's record (issue 39).

At T != 1 a trainer's importance ratio needs ``log_softmax(logits / T)``, which vLLM returns only
with ``--logprobs-mode processed_logprobs`` (vLLM's default, raw, is before temperature), the
mode titoflow's settings default to and the shared test engine (conftest's ``engine_url``, the
random tiny Qwen3) runs in. Sessions are sampled at 0.7 with no cut; each trainer's own code
computes the logprobs of the generated tokens on the weights that sampled, at 0.7 as it applies
a temperature:
- TRL: the recipe of docs/trainer.md with the one change docs/trainer.md asks of a T != 1
  rollout besides the engine's mode, its ``SAMPLING`` temperature (also
  ``GRPOConfig.temperature``, so TRL's forward divides by it);
- OpenRLHF: its ``Actor(temperature=...)`` (``--rollout.temperature``), in its experience maker;
- verl: its actor's ``compute_log_prob`` reads ``meta_info["temperature"]``, which ``to_verl``
  fills (``rollout.temperature``).
Each is within :data:`GAP_BOUND` of the recorded logprobs, and the raw logprobs (the same
forward without the temperature, what vLLM's default records) are further than the bound, so the
bound tells the two modes apart; the adapters refuse the segments saying ``raw_logprobs``.
- Tinker has no temperature in its training forward (``forward_backward`` takes none;
  tinker-cookbook's ``Config.temperature`` reaches only the sampler): ``to_tinker_batch`` refuses
  the 0.7 segments, and cookbook's own path, which takes them, trains on a ratio whose gap is
  the raw one, while the same weights' ``log_softmax(logits / 0.7)`` is within the bound. A
  Tinker user samples at 1 (cookbook's default).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.dev.stack import start_ingress, start_worker
from cli.up import write_run_env
from schemas.events import SegmentFinalized
from tests.support.doc_blocks import blocks_run_by, run_env
from tests.support.trainer_rollouts import rollout_sessions
from tests.support.trainer_steps import openrlhf_step, tinker_step, verl_step
from tests.support.witness import Witness, check_segments
from titoflow.client.formats.openrlhf import to_openrlhf
from titoflow.client.formats.tinker import to_tinker_batch
from titoflow.client.formats.trl import to_trl
from titoflow.client.formats.verl import to_verl
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

TEMPERATURE = 0.7
# vLLM CPU and torch CPU on the same float32 weights (as tests/trainers/test_trainer_trl.py at 1.0).
GAP_BOUND = 1e-3
RECIPE_SAMPLING = 'SAMPLING = {"temperature": 1.0,'
PROMPTS = ["Tell me about /tmp."] * 2  # one group of the recipe's num_generations


def as_raw(segment: SegmentFinalized) -> SegmentFinalized:
    """``segment`` with every step saying its logprobs are raw."""
    steps = [
        step.model_copy(
            update={"sampling": step.sampling.model_copy(update={"logprobs_mode": "raw_logprobs"})}
        )
        if step.sampling is not None
        else step
        for step in segment.steps
    ]
    return segment.model_copy(update={"steps": steps})


async def test_trl_forward_at_temperature_07_matches_processed_logprobs(
    settings: Settings,
    engine_url: str,
    model_dir: Path,
    witness: Witness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    stack = settings.model_copy(
        update={
            "driver_token": secrets.token_urlsafe(32),
            "model_path": model_dir,
            "engine_url": witness.front(engine_url),
            "engine_logprobs_mode": "processed_logprobs",
        }
    )
    [recipe] = blocks_run_by("tests/trainers/test_trainer_trl.py")
    assert recipe.count(RECIPE_SAMPLING) == 1, "the recipe's SAMPLING line changed"
    recipe = recipe.replace(RECIPE_SAMPLING, f'SAMPLING = {{"temperature": {TEMPERATURE},')
    ingress, url = start_ingress(stack, tmp_path)
    worker = start_worker(stack, tmp_path)
    monkeypatch.chdir(tmp_path)  # the recipe's output_dir
    for name in [n for n in os.environ if n.startswith("TITOFLOW")]:
        monkeypatch.delenv(name)
    for name, value in run_env(write_run_env(tmp_path, stack, url, url)).items():
        monkeypatch.setenv(name, value)
    converted: list[Sequence[SegmentFinalized]] = []

    def keeping(sessions: Sequence[Sequence[SegmentFinalized]], temperature: float) -> Any:
        converted.extend(sessions)
        return to_trl(sessions, temperature)

    try:
        namespace: dict[str, Any] = {"__name__": "recipe"}
        exec(compile(recipe, "docs/trainer.md", "exec"), namespace)
        namespace["to_trl"] = keeping  # the recipe's rollouts convert through it
        trainer = namespace["trainer"]
        assert trainer.temperature == TEMPERATURE
        out = await asyncio.to_thread(namespace["rollout_func"], PROMPTS, trainer)
    finally:
        ingress.stop()
        worker.stop()

    segments = [segment for session in converted for segment in session]
    steps = [step for segment in segments for step in segment.steps]
    assert len(converted) == len(PROMPTS) and steps
    for step in steps:
        assert step.sampling is not None
        assert step.sampling.logprobs_mode == "processed_logprobs"
        assert (step.sampling.temperature, step.sampling.top_p) == (TEMPERATURE, 1.0)
    calls = witness.witnessed()
    assert len(calls) == len(steps)
    for call in calls:
        assert call.sampling_params["temperature"] == TEMPERATURE
        assert call.sampling_params["top_p"] == 1.0
    check_segments(segments, calls, complete=True)

    for session in converted:
        with pytest.raises(ValueError, match=f"raw_logprobs, temperature {TEMPERATURE}"):
            to_trl([[as_raw(segment) for segment in session]], TEMPERATURE)

    # TRL's own forward (its fused head divides by GRPOConfig.temperature) on the sampling weights;
    # the plain forward's logits give what a raw engine would have recorded.
    gaps, raw_gaps = [], []
    with torch.no_grad():
        for prompt, completion, logprobs, mask in zip(
            out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"], strict=True
        ):
            ids = torch.tensor([prompt + completion])
            ours, *_ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, torch.ones_like(ids), len(completion)
            )
            logits = trainer.model(ids).logits[0, len(prompt) - 1 : -1]
            raw = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])
            on = np.asarray(mask, dtype=bool)
            gaps.append(np.abs(ours[0].numpy()[on] - np.asarray(logprobs, np.float32)[on]))
            raw_gaps.append(np.abs(ours[0].numpy()[on] - raw[:, 0].numpy()[on]))
    apart("TRL", np.concatenate(gaps), np.concatenate(raw_gaps))


async def test_openrlhf_actor_at_temperature_07_matches_processed_logprobs(
    stack_settings: Settings, model_dir: Path, tmp_path: Path
) -> None:
    segments = recorded(await rollout_sessions(stack_settings, model_dir, tmp_path, TEMPERATURE))
    with pytest.raises(ValueError, match=f"raw_logprobs, temperature {TEMPERATURE}"):
        to_openrlhf([as_raw(s) for s in segments], n_samples_per_prompt=2, temperature=TEMPERATURE)
    samples = to_openrlhf(segments, n_samples_per_prompt=2, temperature=TEMPERATURE)
    _, to_experiences = blocks_run_by("tests/trainers/test_trainer_openrlhf.py")
    out = openrlhf_step(samples, to_experiences, model_dir, tmp_path, TEMPERATURE)

    print(f"OpenRLHF vllm_kl {out['vllm_kl']:.3g}, is_filter_ratio {out['is_filter_ratio']:.3g}")
    apart("OpenRLHF", np.asarray(out["gap_f32"]), np.asarray(out["raw_gap"]))
    assert abs(out["vllm_kl"]) < GAP_BOUND and out["is_filter_ratio"] == 0.0
    assert out["moved"] > 0


async def test_verl_actor_at_temperature_07_matches_processed_logprobs(
    stack_settings: Settings, model_dir: Path, tmp_path: Path
) -> None:
    segments = recorded(await rollout_sessions(stack_settings, model_dir, tmp_path, TEMPERATURE))
    with pytest.raises(ValueError, match=f"raw_logprobs, temperature {TEMPERATURE}"):
        to_verl([as_raw(s) for s in segments], pad_id=151643, temperature=TEMPERATURE)
    batch = to_verl(segments, pad_id=151643, temperature=TEMPERATURE)
    assert batch.meta_info["temperature"] == TEMPERATURE  # what verl's actor divides by
    _, step_block = blocks_run_by("tests/trainers/test_trainer_verl.py")
    out = verl_step(batch, step_block, model_dir, tmp_path)

    corr = out["corr_metrics"]
    print(
        f"verl rollout_corr/kl {corr['rollout_corr/kl']:.3g}, rollout_corr/log_ppl_abs_diff "
        f"{corr['rollout_corr/log_ppl_abs_diff']:.3g}"
    )
    apart("verl", np.asarray(out["gap_f32"]), np.asarray(out["raw_gap"]))
    assert abs(corr["rollout_corr/kl"]) < GAP_BOUND
    assert corr["rollout_corr/log_ppl_abs_diff"] < GAP_BOUND
    assert np.allclose(out["is_weights"], 1.0, atol=1e-2)
    assert out["moved"] > 0


async def test_tinker_has_no_temperature_in_its_training_forward(
    stack_settings: Settings, model_dir: Path, tmp_path: Path
) -> None:
    sessions = await rollout_sessions(stack_settings, model_dir, tmp_path, TEMPERATURE)
    segments = recorded(sessions)
    with pytest.raises(ValueError, match=f"processed_logprobs, temperature {TEMPERATURE}"):
        to_tinker_batch(segments)
    _, cookbook_step = blocks_run_by("tests/trainers/test_trainer_tinker.py")
    # cookbook's own datums of the same sessions: it takes logprobs of any temperature.
    out = tinker_step(sessions, None, cookbook_step, model_dir, tmp_path, TEMPERATURE)

    trained, tempered = np.asarray(out["gap"]), np.asarray(out["gap_at_temperature"])
    kl = out["kl"]["optim/kl_sample_train_v1"]
    print(
        f"Tinker at T={TEMPERATURE}, its forward (no temperature) |train - rollout logprob|: "
        f"mean {trained.mean():.3g}, max {trained.max():.3g} ({trained.size}), "
        f"optim/kl_sample_train_v1 {kl:.3g}; log_softmax(logits / {TEMPERATURE}) of the same "
        f"weights: mean {tempered.mean():.3g}, max {tempered.max():.3g}"
    )
    # The records are right; Tinker's forward, the raw one, is what is off.
    assert trained.size == tempered.size > 0 and tempered.mean() < GAP_BOUND < trained.mean()
    assert abs(kl) > GAP_BOUND


def recorded(sessions: list[list[SegmentFinalized]]) -> list[SegmentFinalized]:
    """The sessions' segments, each step recorded in processed mode at the test's temperature."""
    segments = [s for session in sessions for s in session]
    assert len(segments) == 4 and all(not s.unused_sample for s in segments)
    for step in (step for s in segments for step in s.steps):
        assert step.sampling is not None
        assert step.sampling.logprobs_mode == "processed_logprobs"
        assert (step.sampling.temperature, step.sampling.top_p) == (TEMPERATURE, 1.0)
    return segments


def apart(trainer: str, gap: np.ndarray, raw_gap: np.ndarray) -> None:
    """``gap`` (|the trainer's forward at the temperature - the recorded logprobs|) within the
    bound, ``raw_gap`` (|it - raw logprobs|) beyond it; prints both, as docs/benchmarks.md §8
    reports them."""
    print(
        f"{trainer} at T={TEMPERATURE} |train - rollout logprob|: mean {gap.mean():.3g}, "
        f"max {gap.max():.3g} ({gap.size}); raw logprobs instead: mean {raw_gap.mean():.3g}, "
        f"max {raw_gap.max():.3g}"
    )
    assert gap.size == raw_gap.size > 0 and gap.mean() < GAP_BOUND < raw_gap.mean()

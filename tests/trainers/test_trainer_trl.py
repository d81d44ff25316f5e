"""A real GRPO step in TRL's own code on rollouts titoflow recorded (issue 39, TRL).

The recipe of docs/trainer.md (the block marked ``<!-- tested by tests/trainers/test_trainer_trl.py
-->``) runs as written beside a real stack, with the environment `titoflow up`'s ``.run/env`` gives:
TRL hands its rollout function the prompts; each runs as an agent session through the stack
(openai SDK → ingress → vLLM CPU, the random tiny Qwen3 whose logprobs are far from 0), is
finalized with a reward and comes back through :func:`titoflow.client.formats.trl.to_trl`. TRL
then runs its own forward, loss, backward and optimizer step on the weights the engine serves.

The train/rollout gap is measured with TRL's own forward (``_get_per_token_logps_and_entropies``)
on those weights before the update: the mean absolute difference between its logprobs of the
generated tokens and those the engine recorded (temperature 1, no cut).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cli.dev.stack import start_ingress, start_worker
from cli.up import write_run_env
from tests.support.doc_blocks import blocks_run_by, run_env
from tests.support.witness import Witness
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

# vLLM CPU and torch CPU on the same float32 weights.
GAP_BOUND = 1e-3


async def test_a_grpo_step_in_trl_on_titoflow_rollouts(
    stack_settings: Settings,
    model_dir: Path,
    witness: Witness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    settings = stack_settings.model_copy(
        update={"driver_token": secrets.token_urlsafe(32), "model_path": model_dir}
    )
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    monkeypatch.chdir(tmp_path)  # the recipe's output_dir
    for name in [n for n in os.environ if n.startswith("TITOFLOW")]:
        monkeypatch.delenv(name)
    for name, value in run_env(write_run_env(tmp_path, settings, url, url)).items():
        monkeypatch.setenv(name, value)
    seen: dict[str, Any] = {"gaps": [], "calls": 0}
    try:
        namespace: dict[str, Any] = {"__name__": "recipe"}
        [recipe] = blocks_run_by("tests/trainers/test_trainer_trl.py")
        exec(compile(recipe, "docs/trainer.md", "exec"), namespace)
        trainer = namespace["trainer"]
        model = trainer.model
        before = [p.detach().clone() for p in model.parameters()]
        recipes_rollout = trainer.rollout_func

        def rollout_func(prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
            out: dict[str, list[Any]] = recipes_rollout(prompts, trainer)
            seen["calls"] += 1
            seen["prompts"] = list(prompts)
            # TRL's own forward on the weights that sampled, before its update.
            with torch.no_grad():
                for prompt, completion, logprobs, mask in zip(
                    out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"],
                    strict=True,
                ):  # fmt: skip
                    ids = torch.tensor([prompt + completion])
                    ours, *_ = trainer._get_per_token_logps_and_entropies(
                        trainer.model, ids, torch.ones_like(ids), len(completion)
                    )
                    on = np.asarray(mask, dtype=bool)
                    seen["gaps"].append(
                        np.abs(ours[0].numpy()[on] - np.asarray(logprobs, np.float32)[on])
                    )
            return out

        trainer.rollout_func = rollout_func
        await asyncio.to_thread(trainer.train)
    finally:
        ingress.stop()
        worker.stop()

    # One group of one prompt, one entry per rollout, one optimizer step that moved the weights.
    assert seen["calls"] == 1 and len(seen["prompts"]) == 2 and len(set(seen["prompts"])) == 1
    assert trainer.state.global_step == 1
    moved = sum(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert moved > 0, "TRL's optimizer step changed no weight"
    gaps = np.concatenate(seen["gaps"])
    print(
        f"TRL |train - rollout logprob|: mean {gaps.mean():.3g}, max {gaps.max():.3g} ({gaps.size})"
    )
    assert gaps.size > 0 and gaps.mean() < GAP_BOUND

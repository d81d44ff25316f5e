"""verl's own actor, GRPO advantage and rollout correction on titoflow's batch, run in .venv-verl
(scripts/setup-verl.sh, verl 0.7.1) by tests/trainers/test_trainer_verl.py:

    .venv-verl/bin/python tests/support/verl_step.py INPUT.pkl OUTPUT.json

INPUT holds what ``to_verl`` made (``batch``, ``non_tensor_batch``, ``meta_info``), the doc's
block that runs verl's step on it and the policy's directory. The block runs as written with
``batch`` and ``policy_path`` in hand, in a one-process gloo group as verl's own CPU test of
the actor makes one (tests/workers/actor/test_special_dp_actor.py); nothing of verl is stubbed.
OUTPUT says what verl computed: per row its advantage and the train/rollout logprob gap of its
actor's ``compute_log_prob`` at ``meta_info["temperature"]`` (float32 as the block runs it, and
bf16, the actor's default autocast), how far those float32 logprobs are from the same actor's at
temperature 1 (what a raw engine records), the ``rollout_corr/`` metrics of its trainer's
correction and of ``update_policy``, the IS weights, and how many weights its optimizer step
moved.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import socket
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main(source: Path, target: Path) -> None:
    given = pickle.loads(source.read_bytes())
    # What torchrun hands each of verl's workers: here a group of one.
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1"
    )
    batch = SimpleNamespace(**given["batch"])
    namespace: dict[str, Any] = {"batch": batch, "policy_path": given["policy_path"]}
    exec(compile(given["block"], "docs/trainer.md", "exec"), namespace)
    data, actor, metrics = namespace["data"], namespace["actor"], namespace["metrics"]

    from transformers import AutoModelForCausalLM
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config import FSDPEngineConfig

    mask = data.batch["response_mask"].bool()
    rollout = data.batch["rollout_log_probs"]
    sampled = AutoModelForCausalLM.from_pretrained(given["policy_path"], dtype=torch.float32)
    moved = sum(
        not torch.equal(a, b)
        for a, b in zip(sampled.parameters(), actor.actor_module.parameters(), strict=True)
    )
    # verl's default: the actor autocasts its forward to bf16 (fsdp_config.dtype).
    config = dataclasses.replace(actor.config, fsdp_config=FSDPEngineConfig())
    bf16 = DataParallelPPOActor(config, sampled).compute_log_prob(data)["log_probs"]
    # The same weights without the temperature: the logprobs vLLM's raw mode records.
    untempered = dataclasses.replace(data, meta_info={**data.meta_info, "temperature": 1.0})
    raw = DataParallelPPOActor(actor.config, sampled).compute_log_prob(untempered)["log_probs"]
    out = {
        "gap_f32": (data.batch["old_log_probs"] - rollout)[mask].abs().tolist(),
        "gap_bf16": (bf16 - rollout)[mask].abs().tolist(),
        "raw_gap": (data.batch["old_log_probs"] - raw)[mask].abs().tolist(),
        "advantages": data.batch["advantages"][:, 0].tolist(),  # a generated token's
        "uid": data.non_tensor_batch["uid"].tolist(),
        "segment_id": data.non_tensor_batch["segment_id"].tolist(),
        "is_weights": data.batch["rollout_is_weights"][mask].tolist(),
        "corr_metrics": namespace["corr_metrics"],
        "metrics": {k: v for k, v in metrics.items() if k.startswith(("actor/", "rollout_corr/"))},
        "moved": moved,
    }
    target.write_text(json.dumps(out))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

"""verl's current release (0.9.1) on titoflow's batch: its data path, model engine, rollout
correction, GRPO advantage and PPO loss, run in .venv-verl with ``.venv-verl/verl-current``
first on the path (scripts/setup-verl.sh) by tests/trainers/test_trainer_verl.py:

    .venv-verl/bin/python tests/support/verl_current_step.py INPUT.pkl OUTPUT.json

INPUT holds what ``to_verl`` made (``batch``, ``non_tensor_batch``, ``meta_info``), the doc's
block that runs verl 0.9.1's step on it and the policy's directory; the block runs as written
with ``batch`` and ``policy_path`` in hand. verl 0.9.1 knows no CPU: its FSDP engine builds its
device mesh on the accelerator its platform layer names (NVIDIA, AMD, Ascend; cuda when none),
and its own CPU tests of the engine bypass ``__init__``
(tests/workers/test_fsdp_gradient_accumulation_sync_on_cpu.py). Here the engine runs whole
(``initialize``, ``infer_batch``, ``train_batch`` with its optimizer step) in a one-process gloo
group on a CPU platform handed to verl's own platform registry (:class:`CPUPlatform`,
``verl.plugin.platform``: what a new backend registers) and ``VERL_ENGINE_DEVICE=cuda`` (verl's
own switch) to pick the FSDP engine registered for cuda. Nothing of verl is stubbed. OUTPUT
says what verl computed: per row its advantage, the train/rollout logprob gap of its engine's
``old_log_probs`` (float32 as the block runs it, and bf16, the engine's default mixed
precision), the ``rollout_corr/`` metrics, the IS weights, the loss step's metrics and how many
weights its optimizer step moved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# verl 0.9.1 and its own pins (numpy 2, transformers 5) ahead of .venv-verl's 0.7.1 set.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / ".venv-verl" / "verl-current"))

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry, set_platform


@PlatformRegistry.register(platform="cpu")
class CPUPlatform(PlatformBase):  # type: ignore[misc]  # verl is untyped here
    """The host as verl's one device: torch.cpu, the gloo backend, nothing to profile."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = torch.cpu

    def is_available(self) -> bool:
        return True

    # Where verl moves tensors and modules (``.to(current_device())``): a string torch takes.
    def current_device(self) -> Any:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return (None, None)

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main(source: Path, target: Path) -> None:
    given = pickle.loads(source.read_bytes())
    set_platform(CPUPlatform())
    # What torchrun hands each of verl's workers: here a group of one. The FSDP engine is
    # registered for cuda and npu only; verl's own switch picks the cuda one on this platform.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        VERL_ENGINE_DEVICE="cuda",
    )
    torch.distributed.init_process_group("gloo")
    batch = SimpleNamespace(**given["batch"])
    namespace: dict[str, Any] = {"batch": batch, "policy_path": given["policy_path"]}
    exec(compile(given["block"], "docs/trainer.md", "exec"), namespace)
    data, engine, metrics = namespace["data"], namespace["engine"], namespace["metrics"]

    from transformers import AutoModelForCausalLM
    from verl.workers.engine import EngineRegistry
    from verl.workers.utils.padding import no_padding_2_padding

    mask = data.batch["response_mask"].bool()
    rollout = data.batch["rollout_log_probs"]
    sampled = AutoModelForCausalLM.from_pretrained(given["policy_path"], dtype=torch.float32)
    moved = sum(
        not torch.equal(a, b.full_tensor())
        for a, b in zip(sampled.parameters(), engine.module.parameters(), strict=True)
    )
    # verl's default: the engine's FSDP mixed precision keeps bf16 parameters for the forward.
    default = EngineRegistry.new(
        model_type="language_model",
        backend="fsdp",
        model_config=engine.model_config,
        engine_config=dataclasses.replace(engine.engine_config, mixed_precision=None),
        optimizer_config=engine.optimizer_config,
        checkpoint_config=engine.checkpoint_config,
    )
    default.initialize()
    td = namespace["to_engine"](data, calculate_entropy=False, compute_loss=False)
    with default.eval_mode():
        bf16 = no_padding_2_padding(default.infer_batch(td)["model_output"]["log_probs"], td)
    out = {
        "gap_f32": (data.batch["old_log_probs"] - rollout)[mask].abs().tolist(),
        "gap_bf16": (bf16.float() - rollout)[mask].abs().tolist(),
        "advantages": data.batch["advantages"][:, 0].tolist(),  # a generated token's
        "uid": data.non_tensor_batch["uid"].tolist(),
        "segment_id": data.non_tensor_batch["segment_id"].tolist(),
        "is_weights": data.batch["rollout_is_weights"][mask].tolist(),
        "corr_metrics": namespace["corr_metrics"],
        "metrics": {k: plain(v) for k, v in metrics.items()},
        "moved": moved,
    }
    target.write_text(json.dumps(out))
    torch.distributed.destroy_process_group()


def plain(value: Any) -> Any:
    """A metric as JSON: verl's ``Metric`` aggregated as its worker reduces it."""
    from verl.utils.metric import Metric

    if isinstance(value, Metric):
        return float(value.aggregate())
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

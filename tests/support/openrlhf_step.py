"""OpenRLHF's own experience maker, Actor and PPO training step on titoflow's samples, run in
.venv-openrlhf (scripts/setup-openrlhf.sh) by tests/trainers/test_trainer_openrlhf.py:

    .venv-openrlhf/bin/python tests/support/openrlhf_step.py INPUT.pkl OUTPUT.json

INPUT holds the samples ``to_openrlhf`` made, the doc's block that turns them into
``Experience``s, the policy's directory, OpenRLHF's settings and the pad id. OUTPUT says what
OpenRLHF computed: per sample its index, reward and advantage, the train/rollout logprob gap
of its ``Actor`` at the rollout temperature (float32, and bf16 as its own loader makes it), how
far that ``Actor``'s logprobs are from the same ``Actor``'s at temperature 1 (what a raw engine
records), the ``vllm_kl`` and filter ratio of its ``PolicyLoss`` correction, and how many weights
its step moved.

What needs a GPU is stubbed as OpenRLHF's own CPU tests stub it (tests/test_reward_shaping.py,
test_actor_entropy_temperature.py, test_ppo_trainer.py of its 0.11.2 wheel): ``ray``,
``deepspeed``, ``flash_attn`` and ``peft`` are MagicMocks while its modules import (flash_attn's
dropped after, so its log-prob path takes the torch fallback); the Ray actor groups
(``openrlhf.trainer.ray.launcher``) and the DeepSpeed strategy are stand-ins that run the
forward, backward and optimizer step in this process; the trainer is made with ``__new__``
(its ``__init__`` syncs CUDA). The packages ``openrlhf.utils`` and ``openrlhf.trainer.ray`` are
entered without their ``__init__`` (math grading and vLLM engines, not installed); every module
that runs is OpenRLHF's own.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import pickle
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import torch

STUBS = ("deepspeed", "peft", "peft.tuners", "peft.tuners.lora")
FLASH_ATTN = (
    "flash_attn",
    "flash_attn.bert_padding",
    "flash_attn.utils",
    "flash_attn.utils.distributed",
)
GPU_ONLY = (
    "openrlhf.trainer.ray.launcher",
    "openrlhf.utils.deepspeed",
    "openrlhf.utils.deepspeed.deepspeed_utils",
)


def stub(name: str) -> MagicMock:
    module = MagicMock()
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = module
    return module


def bare_package(name: str) -> None:
    """``name`` importable for its submodules, without running its ``__init__``."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations is not None, name
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = package


def import_openrlhf() -> SimpleNamespace:
    ray = stub("ray")
    ray.remote.side_effect = lambda obj=None, **_: (lambda cls: cls) if obj is None else obj
    ray.get.side_effect = lambda value: value
    ray.put.side_effect = lambda value: value
    for name in STUBS + FLASH_ATTN + GPU_ONLY:
        stub(name)
    launcher: Any = sys.modules["openrlhf.trainer.ray.launcher"]
    launcher.BaseModelActor = object
    bare_package("openrlhf.utils")
    bare_package("openrlhf.trainer.ray")
    import openrlhf.utils.utils as utils

    package: Any = sys.modules["openrlhf.utils"]
    package.get_tokenizer = utils.get_tokenizer  # its __init__'s export
    from openrlhf.models import Actor, PolicyLoss
    from openrlhf.trainer.ppo_utils import FixedKLController
    from openrlhf.trainer.ppo_utils.experience import (
        Experience,
        make_experience_batch,
        remove_padding_in_sequences,
        split_experience_batch,
    )
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    for name in FLASH_ATTN:
        del sys.modules[name]
    return SimpleNamespace(
        Actor=Actor,
        PolicyLoss=PolicyLoss,
        FixedKLController=FixedKLController,
        Experience=Experience,
        make_experience_batch=make_experience_batch,
        remove_padding_in_sequences=remove_padding_in_sequences,
        split_experience_batch=split_experience_batch,
        RemoteExperienceMaker=RemoteExperienceMaker,
        ActorPPOTrainer=ActorPPOTrainer,
    )


class ActorGroup:
    """One rank of the Ray actor group: ``PolicyModelActor.forward``'s body, on CPU."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def async_run_method_batch(self, method_name: str, **batch: list[Any]) -> list[list[Any]]:
        assert method_name == "forward", method_name
        self.actor.eval()
        with torch.no_grad():
            out = [
                self.actor(s, a, m, ring_attn_group=None)
                for s, a, m in zip(
                    batch["sequences"], batch["action_mask"], batch["attention_mask"], strict=True
                )
            ]
        self.actor.train()
        return [out]


class Strategy:
    """DeepSpeed's strategy, one process: backward and optimizer step in place."""

    ring_attn_group = None

    def __init__(self, args: SimpleNamespace) -> None:
        self.args = args
        self.grad_norm = 0.0

    def backward(self, loss: Any, model: Any, optimizer: Any) -> None:
        loss.backward()

    def optimizer_step(self, optimizer: Any, model: Any, scheduler: Any, name: str) -> None:
        grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
        self.grad_norm = float(torch.stack(grads).norm())
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()

    def get_grad_norm(self, model: Any) -> float:
        return self.grad_norm


def settings(n_samples_per_prompt: int, temperature: float) -> SimpleNamespace:
    """The parts of ``train_ppo_ray.py``'s arguments the steps read: GRPO (group_norm), no
    reference model, token-level importance-sampling correction on (ICEPOP's mask)."""
    ns = SimpleNamespace
    return ns(
        ds=ns(ring_attn_size=1, tensor_parallel_size=1),
        train=ns(
            colocate_all=False,
            colocate_actor_ref=False,
            colocate_critic_reward=False,
            dynamic_batch_enable=False,
        ),
        rollout=ns(
            micro_batch_size=2, n_samples_per_prompt=n_samples_per_prompt, temperature=temperature
        ),
        reward=ns(clip_range=None),
        algo=ns(
            kl=ns(use_loss=False, estimator="k1"),
            advantage=ns(
                estimator="group_norm",
                gamma=1.0,
                lambd=1.0,
                no_std_norm=False,
                is_correction_level="token",
                is_correction_mode="mask",
                is_correction_gating="ratio",
                is_correction_threshold=[0.5, 5.0],
            ),
        ),
        actor=ns(
            eps_clip_low_high=(0.2, 0.2),
            dual_clip=None,
            loss_agg_mode="token-mean",
            policy_loss_type="ppo",
            entropy_coef=None,
            aux_loss_coef=0.0,
        ),
    )


def gap(logprobs: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> list[float]:
    return (logprobs - rollout).abs()[mask.bool()].tolist()


def main(source: Path, target: Path) -> None:
    data = pickle.loads(source.read_bytes())
    o = import_openrlhf()
    from transformers import AutoModelForCausalLM

    namespace: dict[str, Any] = {"samples": data["samples"]}
    exec(compile(data["block"], "docs/trainer.md", "exec"), namespace)
    samples = namespace["experiences"]
    assert all(isinstance(s, o.Experience) for s in samples)

    args = settings(data["n_samples_per_prompt"], data["temperature"])
    strategy = Strategy(args)
    model = AutoModelForCausalLM.from_pretrained(
        data["model"], dtype=torch.float32, attn_implementation="sdpa"
    )
    actor = o.Actor(model, temperature=data["temperature"])
    actor.packing_samples = False  # Actor leaves it unset for a given module (as in its own test)
    maker = o.RemoteExperienceMaker(
        ActorGroup(actor),
        None,
        None,
        None,
        o.FixedKLController(0.0),
        strategy,
        SimpleNamespace(pad_token_id=data["pad_token_id"]),
    )
    made = maker.make_experience_batch(samples)

    # The same weights without the temperature: the logprobs vLLM's raw mode records.
    raw = o.Actor(model, temperature=1.0).eval()  # eval, as the experience maker's forward
    raw.packing_samples = False
    out: dict[str, Any] = {"samples": [], "gap_f32": [], "gap_bf16": [], "raw_gap": []}
    for exp in made:
        out["gap_f32"] += gap(exp.action_log_probs, exp.rollout_log_probs, exp.action_mask)
        with torch.no_grad():
            logprobs = raw(exp.sequences, exp.action_mask, exp.attention_mask)
        out["raw_gap"] += gap(exp.action_log_probs, logprobs, exp.action_mask)
        for row, index in enumerate(exp.index):
            first = int(exp.action_mask[row].nonzero()[0])
            out["samples"].append(
                {
                    "index": index,
                    "reward": float(exp.info["reward"][row]),
                    "advantage": float(exp.advantages[row, first]),
                }
            )
    # OpenRLHF's own loader (param_dtype bf16 or fp16: it trains in no other).
    bf16 = o.Actor(
        data["model"],
        attn_implementation="sdpa",
        param_dtype="bf16",
        temperature=data["temperature"],
    )
    with torch.no_grad():
        for exp in made:
            logprobs = bf16(exp.sequences, exp.action_mask, exp.attention_mask)
            out["gap_bf16"] += gap(logprobs, exp.rollout_log_probs, exp.action_mask)

    # The replay buffer's way to a training batch (append, then collate), and one PPO step.
    items = o.remove_padding_in_sequences(
        [i for exp in made for i in o.split_experience_batch(exp)]
    )
    batch = o.make_experience_batch(items)
    trainer = o.ActorPPOTrainer.__new__(o.ActorPPOTrainer)
    optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)
    trainer.__dict__.update(
        strategy=strategy,
        args=args,
        actor=actor,
        ema_model=None,
        aux_loss=False,
        actor_optim=optimizer,
        actor_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        replay_buffer=None,
    )
    a = args.actor
    trainer.actor_loss_fn = o.PolicyLoss(  # as ActorPPOTrainer.__init__ builds it
        clip_eps_low=a.eps_clip_low_high[0],
        clip_eps_high=a.eps_clip_low_high[1],
        dual_clip=a.dual_clip,
        token_level_loss=a.loss_agg_mode == "token-mean",
        policy_loss_type=a.policy_loss_type,
        **{
            k: getattr(args.algo.advantage, k)
            for k in vars(args.algo.advantage)
            if k.startswith("is_correction")
        },
    )
    before = [p.detach().clone() for p in actor.parameters()]
    status = trainer.training_step(batch, kl_ctl=0.0, step=0)
    out["moved"] = sum(
        not torch.equal(b, p) for b, p in zip(before, actor.parameters(), strict=True)
    )
    out["vllm_kl"] = float(batch.info["vllm_kl"])
    out["is_filter_ratio"] = float(batch.info["is_filter_ratio"])
    out["policy_loss"] = float(status["metrics"]["policy_loss"])
    out["grad_norm"] = float(status["metrics"]["actor_grad_norm"])
    assert all(math.isfinite(v) for v in (out["vllm_kl"], out["policy_loss"], out["grad_norm"]))
    target.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

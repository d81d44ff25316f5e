"""tinker-cookbook's own RL data path, ``train_step`` and sample/train KL on titoflow's data, run
in .venv-tinker (scripts/setup-tinker.sh, tinker-cookbook 0.6.1) by
tests/trainers/test_trainer_tinker.py:

    .venv-tinker/bin/python tests/support/tinker_step.py INPUT.pkl OUTPUT.json

INPUT holds what ``to_tinker_batch`` made (``data``, ``metadata``; ``None`` where it refused the
segments), the same sessions as a cookbook rollout records them (per group, per trajectory: each
step's observation, sampled tokens and logprobs, and the reward), the doc's block that trains on
``data``, the policy's directory and the temperature the sessions were sampled at.
tinker-cookbook's ``compute_advantages`` and ``assemble_training_data`` turn the trajectories
into its ``Datum``s, which OUTPUT compares field by field with titoflow's; the block runs its
``train_step`` (``importance_sampling``) and ``compute_kl_sample_train`` on titoflow's, or on
cookbook's own where titoflow refused (cookbook takes them as they are). Tinker trains on a
remote service, so ``training_client`` is :class:`TrainingClient`, which runs
``forward_backward`` and ``optim_step`` on the policy here (torch, float32, CPU); nothing of
tinker-cookbook is stubbed. OUTPUT also holds the train/rollout logprob gap of that
forward on the generated tokens, the gap of the same weights' ``log_softmax(logits / T)`` at the
sampling temperature (what a training forward at that temperature would give; Tinker's has no
temperature), the KL metrics, each datum's advantage and how many weights the step moved.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import tinker
import torch


async def resolved(value: Any) -> Any:
    return value


def logprobs_of(model: Any, datum: tinker.Datum, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` of ``model`` for each of ``datum``'s targets."""
    targets = datum.loss_fn_inputs["target_tokens"].to_torch()
    logits = model(input_ids=torch.tensor([datum.model_input.to_ints()])).logits[0].float()
    logprobs: torch.Tensor = (logits / temperature).log_softmax(-1).gather(-1, targets[:, None])
    return logprobs[:, 0]


def gap(data: list[tinker.Datum], logprobs: list[torch.Tensor]) -> list[float]:
    """|``logprobs`` - the sampled logprobs| on each datum's generated tokens (its ``mask``)."""
    found: list[float] = []
    for datum, trained in zip(data, logprobs, strict=True):
        mask = datum.loss_fn_inputs["mask"].to_torch() > 0
        found += (trained - datum.loss_fn_inputs["logprobs"].to_torch())[mask].abs().tolist()
    return found


class TrainingClient:
    """``tinker.TrainingClient``'s ``forward_backward`` and ``optim_step`` on a local policy:
    per datum the forward's logprobs of ``target_tokens`` (``log_softmax(logits)``, what the
    service returns as ``loss_fn_outputs[i]["logprobs"]``), the ``importance_sampling`` loss as
    Tinker documents it (``-(exp(logprobs - sampling logprobs) * advantages).sum()``) and its
    backward; then an Adam step with the ``AdamParams`` given. Each call computes at once and
    returns an awaitable of the result, as the service's futures resolve in call order."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.optimizer: torch.optim.Adam | None = None
        self.loss_fn_inputs: list[set[str]] = []  # what each forward_backward was sent

    def forward_backward(
        self, data: list[tinker.Datum], loss_fn: str, loss_fn_config: Any = None
    ) -> Any:
        assert loss_fn == "importance_sampling" and loss_fn_config is None, loss_fn
        outputs, total = [], 0.0
        for datum in data:
            self.loss_fn_inputs.append(set(datum.loss_fn_inputs))
            inputs = {k: v.to_torch() for k, v in datum.loss_fn_inputs.items()}
            logprobs = logprobs_of(self.model, datum)
            loss = -(torch.exp(logprobs - inputs["logprobs"]) * inputs["advantages"]).sum()
            loss.backward()
            total += float(loss.detach())
            outputs.append({"logprobs": tinker.TensorData.from_torch(logprobs.detach())})
        return resolved(
            tinker.ForwardBackwardOutput(
                loss_fn_output_type="TorchLossReturn",
                loss_fn_outputs=outputs,
                metrics={"loss:sum": total},
            )
        )

    def optim_step(self, params: tinker.AdamParams) -> Any:
        if self.optimizer is None:
            self.optimizer = torch.optim.Adam(self.model.parameters())
        for group in self.optimizer.param_groups:
            group.update(
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        self.optimizer.step()
        self.optimizer.zero_grad()
        return resolved(tinker.OptimStepResponse(metrics={"optimizer_steps:sum": 1.0}))


def cookbook_groups(groups: list[list[dict[str, Any]]]) -> list[Any]:
    """The sessions as tinker-cookbook's rollout records them: one ``Transition`` per step
    (the step's whole prompt, its sampled tokens and logprobs), the reward at the group level."""
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

    made = []
    for group in groups:
        trajectories = []
        for trajectory in group:
            steps = trajectory["steps"]
            transitions = [
                Transition(
                    ob=tinker.ModelInput.from_ints(ob),
                    ac=TokensWithLogprobs(tokens=tokens, maybe_logprobs=logprobs),
                    reward=0.0,
                    episode_done=i == len(steps) - 1,
                )
                for i, (ob, tokens, logprobs) in enumerate(steps)
            ]
            trajectories.append(Trajectory(transitions, final_ob=tinker.ModelInput.empty()))
        rewards = [trajectory["reward"] for trajectory in group]
        made.append(TrajectoryGroup(trajectories, rewards, [{} for _ in group]))
    return made


def differences(ours: list[tinker.Datum], theirs: list[tinker.Datum]) -> list[str]:
    """Where titoflow's datums differ from tinker-cookbook's (keys in order, values bit for bit)."""
    if len(ours) != len(theirs):
        return [f"{len(ours)} datums, tinker-cookbook made {len(theirs)}"]
    found = []
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a.model_input.to_ints() != b.model_input.to_ints():
            found.append(f"datum {i}: model_input")
        if list(a.loss_fn_inputs) != list(b.loss_fn_inputs):
            found.append(f"datum {i}: keys {list(a.loss_fn_inputs)} != {list(b.loss_fn_inputs)}")
            continue
        for key, value in a.loss_fn_inputs.items():
            x, y = value.to_numpy(), b.loss_fn_inputs[key].to_numpy()
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                found.append(f"datum {i}: {key} {x.dtype}{x.shape} != {y.dtype}{y.shape}")
    return found


def main(source: Path, target: Path) -> None:
    given = pickle.loads(source.read_bytes())
    from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
    from transformers import AutoModelForCausalLM

    groups = cookbook_groups(given["groups"])
    theirs, their_metadata = assemble_training_data(
        groups, compute_advantages(groups), include_provenance=False
    )
    model = AutoModelForCausalLM.from_pretrained(given["policy_path"], dtype=torch.float32)
    with torch.no_grad():
        tempered = [logprobs_of(model, d, given["temperature"]) for d in theirs]
    before = [p.detach().clone() for p in model.parameters()]
    client = TrainingClient(model)
    data = given["data"]
    if data is None:  # titoflow refused the sessions; cookbook's rollout would train on them
        data = [
            {"model_input": d.model_input.model_dump(), "loss_fn_inputs": d.loss_fn_inputs}
            for d in theirs
        ]
    namespace: dict[str, Any] = {"data": data, "training_client": client}
    exec(compile(given["block"], "docs/trainer.md", "exec"), namespace)
    data, logprobs = namespace["data_D"], namespace["training_logprobs_D"]

    out = {
        "differences": differences(data, theirs),
        "metadata": given["metadata"],
        "their_metadata": their_metadata,
        "advantages": [  # on the first generated token
            float(
                d.loss_fn_inputs["advantages"].to_numpy()[d.loss_fn_inputs["mask"].to_numpy() > 0][
                    0
                ]
            )
            for d in data
        ],
        "sent": sorted(set().union(*client.loss_fn_inputs)),
        "gap": gap(data, logprobs),
        "gap_at_temperature": gap(theirs, tempered),
        "kl": namespace["kl_metrics"],
        "moved": sum(
            not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)
        ),
    }
    target.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

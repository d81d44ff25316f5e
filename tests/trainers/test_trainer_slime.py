"""slime's rollout function, as docs/trainer.md writes it, on a real stack (issue 39, slime/miles).

slime is not installable here (Megatron, SGLang), so the block marked ``<!-- tested by
tests/trainers/test_trainer_slime.py -->`` runs against what it imports of slime rebuilt from its
source at the pinned commit (624b824, the one tests/support/trainer_formats.json is extracted from):
``Sample``
as a dataclass of exactly the extracted fields (so ``Sample(**fields)`` refuses a name slime's
does not define) with ``Sample.Status`` and ``get_reward_value`` as the format checks hold them,
and ``RolloutFnTrainOutput``. The test then calls it as slime's rollout manager does
(``call_rollout_fn(fn, args, rollout_id, data_source, evaluation=False)``, ray/rollout.py:592)
with the data source's ``get_samples``, and reads the output as the manager does: the
``list[list[Sample]]`` flattened, then ``_convert_samples_to_train_data``'s checks and fields.
The agent sessions run through the stack (openai SDK → ingress → vLLM CPU, the random tiny
Qwen3). A sync test: the function runs its sessions with ``asyncio.run``, as in slime's process.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import os
import secrets
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cli.dev.stack import start_ingress, start_worker
from cli.up import write_run_env
from tests.support.doc_blocks import blocks_run_by, run_env
from tests.support.format_definitions import DEFINED, SlimeSample, Status, conforms
from tests.support.trainer_rollouts import PROMPTS
from tests.support.witness import Witness
from titoflow.client.formats.slime import group_normalized_rewards
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

SLIME = DEFINED["slime"]
N_SAMPLES_PER_PROMPT = 2


@dataclasses.dataclass
class RolloutFnTrainOutput:
    """slime rollout/base_types.py:8-11."""

    samples: list[list[Any]]
    metrics: dict[str, Any] | None = None


def sample_class() -> type:
    """slime's ``Sample`` (utils/types.py:94): the extracted fields, each defaulting to None
    here, its ``Status`` and ``get_reward_value``."""
    fields = [(name, Any, dataclasses.field(default=None)) for name in SLIME["fields"]]
    return dataclasses.make_dataclass(
        "Sample", fields, bases=(SlimeSample,), namespace={"Status": Status}
    )


def call_rollout_fn(fn: Any, *args: Any, evaluation: bool, **kwargs: Any) -> Any:
    """slime rollout/base_types.py:19-26, for training (a plain list is wrapped)."""
    output = fn(*args, **kwargs, evaluation=evaluation)
    return output if isinstance(output, RolloutFnTrainOutput) else RolloutFnTrainOutput(output)


class DataSource:
    """``RolloutDataSource.get_samples`` (slime rollout/data_source.py:90-118) over a list of
    prompt samples: each ``n_samples_per_prompt`` times, deep-copied, ``group_index`` per
    prompt and ``index`` per copy."""

    def __init__(self, prompts: list[Any]) -> None:
        self.prompts = prompts
        self.offset = self.sample_group_index = self.sample_index = 0

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        taken = self.prompts[self.offset : self.offset + num_samples]
        self.offset += num_samples
        groups = []
        for prompt_sample in taken:
            group = []
            for _ in range(N_SAMPLES_PER_PROMPT):
                sample = copy.deepcopy(prompt_sample)
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups


def slime_group_norm(raw: list[float]) -> list[float]:
    """slime's own GRPO normalization when the batch is exactly ``n_samples_per_prompt *
    rollout_batch_size`` samples, groups by position (ray/rollout.py:614-632)."""
    rewards = torch.tensor(raw, dtype=torch.float).reshape(-1, N_SAMPLES_PER_PROMPT)
    rewards = rewards - rewards.mean(dim=-1, keepdim=True)
    return (rewards / (rewards.std(dim=-1, keepdim=True) + 1e-6)).flatten().tolist()


def test_the_slime_rollout_function_of_the_docs_returns_slime_s_samples(
    stack_settings: Settings,
    model_dir: Path,
    witness: Witness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sample = sample_class()
    imported: dict[str, dict[str, Any]] = {
        "slime": {},
        "slime.utils": {},
        "slime.utils.types": {"Sample": sample},
        "slime.rollout": {},
        "slime.rollout.base_types": {"RolloutFnTrainOutput": RolloutFnTrainOutput},
    }
    for name, members in imported.items():
        module = types.ModuleType(name)
        module.__dict__.update(members)
        monkeypatch.setitem(sys.modules, name, module)
    settings = stack_settings.model_copy(
        update={"driver_token": secrets.token_urlsafe(32), "model_path": model_dir}
    )
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    for name in [n for n in os.environ if n.startswith("TITOFLOW")]:
        monkeypatch.delenv(name)
    for name, value in run_env(write_run_env(tmp_path, settings, url, url)).items():
        monkeypatch.setenv(name, value)
    args = SimpleNamespace(
        rollout_batch_size=len(PROMPTS),
        rollout_temperature=1.0,
        reward_key=None,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
    )
    data_source = DataSource([sample(prompt=p) for p in PROMPTS])
    try:
        [recipe] = blocks_run_by("tests/trainers/test_trainer_slime.py")
        namespace: dict[str, Any] = {"__name__": "my_rollout"}
        exec(compile(recipe, "docs/trainer.md", "exec"), namespace)
        generate_rollout = namespace["generate_rollout"]
        # The signature --rollout-function-path's help names (slime utils/arguments.py:337).
        parameters = inspect.signature(generate_rollout).parameters
        assert list(parameters) == ["args", "rollout_id", "data_source", "evaluation"]
        assert parameters["evaluation"].default is False
        output = call_rollout_fn(generate_rollout, args, 0, data_source, evaluation=False)
        with pytest.raises(NotImplementedError):
            generate_rollout(args, 0, data_source, evaluation=True)
    finally:
        ingress.stop()
        worker.stop()

    # One list of Samples per prompt (validate_rollout_id_annotated's depth 2), in order.
    groups = output.samples
    assert [len(group) for group in groups] == [N_SAMPLES_PER_PROMPT] * len(PROMPTS)
    assert all(type(s) is sample for group in groups for s in group)
    instances = [[s.metadata["instance_id"] for s in group] for group in groups]
    assert instances == [[f"prompt-{g}"] * N_SAMPLES_PER_PROMPT for g in range(len(PROMPTS))]
    samples = list(itertools.chain.from_iterable(groups))  # ray/rollout.py:603-604
    # What _convert_samples_to_train_data (ray/rollout.py:635-700) reads and asserts: the
    # fields as annotated (status the enum member its truncated count compares), the lengths.
    for s in samples:
        for name in ("tokens", "response_length", "loss_mask", "rollout_log_probs", "status"):
            value = getattr(s, name)
            assert conforms(value, SLIME["fields"][name]["type"], SLIME["status"]), (name, value)
        for invariant in SLIME["invariants"]:  # e.g. len(loss_mask) == response_length
            assert eval(invariant, {"len": len}, vars(s)), invariant
        assert sum(s.loss_mask) > 0 and s.weight_versions
    # A rollout id on each (the manager numbers those without one), a session each, none split.
    assert sorted(s.rollout_id for s in samples) == list(range(len(samples)))
    # The group normalization it is run with: here, uneven groups and split sessions absent,
    # slime's own positional one.
    raw, rewards = group_normalized_rewards(args, samples)
    assert raw == [s.reward for s in samples] and len(set(raw)) > 1
    assert rewards == pytest.approx(slime_group_norm(raw), abs=1e-5)

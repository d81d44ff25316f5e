"""The trainer-format converters (titoflow/client/formats) against each format's published
definition: the field names, types, dtypes and shapes extracted from verl's, slime's, miles',
OpenRLHF's and Tinker's own sources at pinned commits (tests/trainer_formats.json, built by
tests/trainer_formats.py; no framework is imported), and the values: the segment's exact
tokens, masks and logprob bits in the places each format reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from schemas.events import SamplingUsed, SegmentFinalized
from tests.segments import filled_segment, step_segment
from titoflow.client.batch import instance_key
from titoflow.client.formats.openrlhf import to_openrlhf
from titoflow.client.formats.slime import to_slime
from titoflow.client.formats.tinker import to_tinker
from titoflow.client.formats.trl import to_trl
from titoflow.client.formats.verl import to_verl
from titoflow.settings import PROJECT_ROOT

DEFINED = json.loads(Path(__file__).with_name("trainer_formats.json").read_text())
PAD = 151643


def f32(values: Any) -> bytes:
    return np.asarray(values, dtype=np.float32).tobytes()


def bits(segment: SegmentFinalized, lo: int, hi: int | None = None) -> bytes:
    """The float32 bits of the segment's logprobs in [lo, hi), 0.0 where it has none."""
    known = np.asarray(segment.logprob_source[lo:hi]) != 0
    return (
        np.where(known, np.asarray(segment.logprobs[lo:hi], np.float32), 0.0)
        .astype(np.float32)
        .tobytes()
    )


SEGMENTS = [
    filled_segment("a", [-0.0, -1e-45, -2.5, -7.25, float("-inf")]),
    filled_segment("b", [-0.5], instance=None),
    filled_segment("c", [-3.0, -0.125, -1.0, -2.0, -4.0, -8.0, -0.75], instance="prompt-1"),
]
UNREWARDED = [filled_segment("d", [-1.0, -2.0], reward=None), SEGMENTS[1]]


def dims(expression: str, names: dict[str, int]) -> list[tuple[int, ...]]:
    """The shapes a comment such as ``[bsz, prompt_length + response_length]`` or
    ``(B, A)`` allows, with ``names`` substituted (alternatives joined by ``or``)."""
    shapes = []
    for group in re.findall(r"[\[(]([^\])]*)[\])]", expression):
        terms = [term.strip() for term in group.split(",") if term.strip()]
        shapes.append(
            tuple(sum(_size(name.strip(), names) for name in t.split("+")) for t in terms)
        )
    return shapes


def _size(name: str, names: dict[str, int]) -> int:
    return int(name) if name.isdigit() else names[name]


# --- verl -----------------------------------------------------------------------------------


def test_verl_batch_has_the_agent_loop_keys_dtypes_and_shapes() -> None:
    verl = DEFINED["verl"]
    batch = to_verl(SEGMENTS, pad_id=PAD)
    prompt = max(s.steps[0].completion_start for s in SEGMENTS)
    response = max(len(s.token_ids) - s.steps[0].completion_start for s in SEGMENTS)
    names = {"bsz": len(SEGMENTS), "prompt_length": prompt, "response_length": response}
    assert set(batch.batch) <= set(verl["batch_keys"])
    assert set(verl["batch_keys"]) - set(batch.batch) == {"routed_experts"}  # not recorded here
    for key, array in batch.batch.items():
        assert array.dtype == np.dtype(verl["dtypes"][key]), key
        shapes = dims(verl["batch_keys"][key] or verl["shapes"][key], names)
        assert array.shape in shapes, (key, array.shape, shapes)
    assert set(verl["non_tensor_keys"]) <= set(batch.non_tensor_batch)
    assert all(len(v) == len(SEGMENTS) for v in batch.non_tensor_batch.values())


def test_verl_batch_holds_each_segment_exactly() -> None:
    out = to_verl(SEGMENTS, pad_id=PAD, prompt_length_to=6, response_length_to=16)
    b = out.batch
    assert np.array_equal(b["input_ids"], np.concatenate([b["prompts"], b["responses"]], axis=1))
    expected_positions = np.clip(np.cumsum(b["attention_mask"], axis=1) - 1, 0, None)
    assert np.array_equal(b["position_ids"], expected_positions)
    for row, segment in enumerate(SEGMENTS):
        split = segment.steps[0].completion_start
        n = len(segment.token_ids) - split
        assert b["prompts"][row, : 6 - split].tolist() == [PAD] * (6 - split)  # left-padded
        assert b["prompts"][row, 6 - split :].tolist() == segment.token_ids[:split]
        assert b["responses"][row, :n].tolist() == segment.token_ids[split:]
        assert b["responses"][row, n:].tolist() == [PAD] * (16 - n)
        assert b["response_mask"][row, :n].tolist() == segment.loss_mask[split:]
        assert b["response_mask"][row, n:].sum() == 0
        assert b["rollout_log_probs"][row, :n].tobytes() == bits(segment, split)
        assert b["rm_scores"][row].tobytes() == f32(np.eye(16)[n - 1] * segment.reward)
        assert out.non_tensor_batch["uid"][row] == instance_key(segment)
    with pytest.raises(ValueError, match="more than"):
        to_verl(SEGMENTS, pad_id=PAD, response_length_to=4)
    assert "rm_scores" not in to_verl(UNREWARDED, pad_id=PAD).batch


# --- slime / miles --------------------------------------------------------------------------


def conforms(value: Any, annotation: str, status: list[str]) -> bool:
    """Whether ``value`` fits a field annotation of Sample (the forms it uses)."""
    options = [option.strip() for option in annotation.split(" | ")]
    checks = {
        "None": lambda v: v is None,
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, float),
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, dict),
        "dict[str, Any]": lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
        "list[int]": lambda v: isinstance(v, list) and all(type(x) is int for x in v),
        "list[float]": lambda v: isinstance(v, list) and all(type(x) is float for x in v),
        "list[str]": lambda v: isinstance(v, list) and all(type(x) is str for x in v),
        "Status": lambda v: v in status,  # the converter gives the enum's value
    }
    return any(checks[option](value) for option in options if option in checks)


@pytest.mark.parametrize("framework", ["slime", "miles"])
def test_slime_and_miles_sample_fields(framework: str) -> None:
    defined = DEFINED[framework]
    for segment in [*SEGMENTS, *UNREWARDED]:
        fields = to_slime(segment)
        assert set(fields) <= set(defined["fields"]), set(fields) - set(defined["fields"])
        for name, value in fields.items():
            annotation = defined["fields"][name]["type"]
            assert conforms(value, annotation, defined["status"]), (name, value, annotation)
        n = fields["response_length"]
        for invariant in defined["invariants"]:  # e.g. len(loss_mask) == response_length
            assert eval(invariant, {"len": len}, fields), invariant
        split = len(segment.token_ids) - n
        assert split == segment.steps[0].completion_start
        assert fields["tokens"] == segment.token_ids
        assert fields["loss_mask"] == segment.loss_mask[split:]
        assert f32(fields["rollout_log_probs"]) == bits(segment, split)
        assert fields["weight_versions"] == ["v1"]
    assert to_slime(SEGMENTS[0])["reward"] == 1.0 and to_slime(SEGMENTS[0])["status"] == "completed"
    assert to_slime(UNREWARDED[0])["reward"] is None


# --- OpenRLHF -------------------------------------------------------------------------------


def test_openrlhf_experience_fields_dtypes_and_shapes() -> None:
    defined = DEFINED["openrlhf"]
    fields = to_openrlhf(SEGMENTS, pad_id=PAD)
    tensors = {name for name, f in defined["fields"].items() if "role" in f}
    assert set(fields) <= tensors
    longest = max(len(s.token_ids) for s in SEGMENTS)
    names = {"B": len(SEGMENTS), "T": longest, "A": longest - 1}  # READ: action_length T - 1
    assert defined["action_length"] == "T - 1"
    for name, array in fields.items():
        assert array.dtype == np.dtype(defined["dtypes"][name]), name
        [shape] = dims(defined["fields"][name]["comment"].split(")")[0] + ")", names)
        assert array.shape == shape, (name, array.shape, shape)
    for row, segment in enumerate(SEGMENTS):
        n = len(segment.token_ids)
        assert fields["sequences"][row, :n].tolist() == segment.token_ids
        assert fields["action_mask"][row, : n - 1].tolist() == [
            bool(m) for m in segment.loss_mask[1:]
        ]
        assert fields["rollout_log_probs"][row, : n - 1].tobytes() == bits(segment, 1)
        assert fields["total_length"][row] == n
    assert "rewards" not in to_openrlhf(UNREWARDED, pad_id=PAD)


# --- Tinker ---------------------------------------------------------------------------------


@pytest.mark.parametrize("advantage", [None, -0.75])
def test_tinker_datum_fields(advantage: float | None) -> None:
    defined = DEFINED["tinker"]
    for segment in SEGMENTS:
        datum = to_tinker(segment, advantage)
        assert set(datum) == {"model_input", "loss_fn_inputs"}
        assert list(datum["model_input"]) == defined["model_input_fields"]
        [chunk] = datum["model_input"]["chunks"]
        assert set(chunk) == set(defined["chunk_fields"]) and chunk["type"] == defined["chunk_type"]
        assert chunk["tokens"] == segment.token_ids[:-1]
        inputs = datum["loss_fn_inputs"]
        loss = "cross_entropy" if advantage is None else "importance_sampling"
        assert list(inputs) == defined["loss_inputs"][loss]
        for name, array in inputs.items():
            assert array.dtype == np.dtype(defined["loss_fn_input_dtypes"][name]), name
            assert array.shape == (len(segment.token_ids) - 1,), name
        assert inputs["target_tokens"].tolist() == segment.token_ids[1:]
        mask = np.asarray(segment.loss_mask[1:], np.float32)
        if advantage is None:
            assert inputs["weights"].tobytes() == mask.tobytes()
        else:
            assert inputs["logprobs"].tobytes() == bits(segment, 1)
            assert inputs["advantages"].tobytes() == f32(mask * np.float32(advantage))


def test_a_trained_token_without_a_logprob_is_refused_by_every_converter() -> None:
    broken = SEGMENTS[0].model_copy(update={"logprob_source": [0] * len(SEGMENTS[0].token_ids)})
    for convert in (
        lambda: to_verl([broken], PAD),
        lambda: to_slime(broken),
        lambda: to_openrlhf([broken], PAD),
        lambda: to_tinker(broken, 1.0),
    ):
        with pytest.raises(ValueError, match="no engine logprob"):
            convert()


def test_the_formats_example_of_the_docs_runs_as_written() -> None:
    text = (PROJECT_ROOT / "docs" / "trainer.md").read_text()
    [example] = re.findall(
        r"<!-- tested by tests/test_trainer_formats\.py -->\s*```python\n(.*?)```", text, re.DOTALL
    )
    segments = [*SEGMENTS[:2], SEGMENTS[2].model_copy(update={"reward": 0.0})]
    namespace: dict[str, Any] = {"segments": segments}
    exec(compile(example, "docs/trainer.md", "exec"), namespace)
    assert set(namespace["batch"].batch) >= {"input_ids", "response_mask", "rollout_log_probs"}
    # Grouped by instance: a and c (prompt-1, rewards 1 and 0) get +0.5 and -0.5 on their
    # generated tokens, b (alone) 0.
    by_tokens = {tuple(d["model_input"]["chunks"][0]["tokens"]): d for d in namespace["data"]}
    for segment, advantage in zip(segments, [0.5, 0.0, -0.5], strict=True):
        got = by_tokens[tuple(segment.token_ids[:-1])]["loss_fn_inputs"]["advantages"]
        assert got.tobytes() == f32(np.asarray(segment.loss_mask[1:]) * advantage)


def test_trl_takes_one_entry_per_rollout_with_the_env_tokens_masked() -> None:
    """``GRPOTrainer(rollout_func=…)``'s fields: prompt before the first generated token, the
    rest as the completion, ``env_mask`` 0 on the user turn between the two generations."""
    rollout = step_segment("r", ([1, 2], [10, 11], [-0.5, -0.25]), ([3], [12], [-2.0]))
    unused = step_segment("u", ([1, 2], [13], [-1.0]), unused_sample=True)
    out = to_trl([[unused, rollout]])
    assert out == {
        "prompt_ids": [[1, 2]],
        "completion_ids": [[10, 11, 3, 12]],
        "logprobs": [[-0.5, -0.25, 0.0, -2.0]],
        "env_mask": [[1, 1, 0, 1]],
    }
    with pytest.raises(ValueError, match="2 trajectory segments"):
        to_trl([[rollout, step_segment("r2", ([4], [5], [-1.0]))]])


@pytest.mark.parametrize(
    ("sampled", "temperature", "refused"),
    [
        ({"temperature": 1.0, "top_p": 1.0}, 1.0, False),
        ({"temperature": 0.7, "top_p": 1.0, "logprobs_mode": "processed_logprobs"}, 0.7, False),
        ({"temperature": 0.7, "top_p": 1.0}, 0.7, True),  # raw: before temperature
        ({"temperature": 1.0, "top_p": 0.9}, 1.0, True),  # a cut TRL's forward does not make
        ({"temperature": 1.0, "top_p": 1.0, "top_k": 20}, 1.0, True),
        ({"temperature": 1.0, "top_p": 1.0}, 0.7, True),  # not TRL's temperature
    ],
)
def test_trl_refuses_logprobs_of_another_policy_than_its_forward(
    sampled: dict[str, Any], temperature: float, refused: bool
) -> None:
    segment = step_segment("r", ([1, 2], [10], [-0.5]))
    steps = [s.model_copy(update={"sampling": SamplingUsed(max_tokens=8, **sampled)})
             for s in segment.steps]  # fmt: skip
    segment = segment.model_copy(update={"steps": steps})
    if refused:
        with pytest.raises(ValueError, match="not TRL's"):
            to_trl([[segment]], temperature)
    else:
        assert to_trl([[segment]], temperature)["completion_ids"] == [[10]]

"""The trainer-format converters (titoflow/client/formats) against each format's published
definition: the field names, types, dtypes and shapes extracted from verl's, slime's, miles',
OpenRLHF's and Tinker's own sources at pinned commits (tests/support/trainer_formats.json, built by
tests/support/trainer_formats.py; no framework is imported), and the values: the segment's exact
tokens, masks and logprob bits in the places each format reads them."""

from __future__ import annotations

import re
import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from schemas.events import SamplingUsed, SegmentFinalized
from tests.support.doc_blocks import blocks_run_by
from tests.support.factories import filled_segment, step_segment
from tests.support.format_definitions import DEFINED, SlimeSample, Status, conforms
from titoflow.client.batch import instance_key
from titoflow.client.formats.openrlhf import to_openrlhf
from titoflow.client.formats.slime import group_normalized_rewards, to_slime
from titoflow.client.formats.tinker import to_tinker, to_tinker_batch
from titoflow.client.formats.trl import to_trl
from titoflow.client.formats.verl import to_verl

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
    # What verl's trainer and actor read whatever the model: multi_modal_inputs on every row
    # (RayPPOTrainer.fit iterates it), the actor's temperature, the FSDP worker's token count.
    assert batch.non_tensor_batch["multi_modal_inputs"].tolist() == [{}] * len(SEGMENTS)
    assert batch.meta_info == {
        "temperature": 1.0,
        "global_token_num": [len(s.token_ids) for s in SEGMENTS],
        "images_seqlens": [],
    }


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
    # uid as verl makes it, a UUID string per prompt: one per instance, the same every time.
    uids = out.non_tensor_batch["uid"].tolist()
    assert [str(uuid.UUID(u)) for u in uids] == uids
    keys = [instance_key(s) for s in SEGMENTS]
    assert [[a == b for b in uids] for a in uids] == [[a == b for b in keys] for a in keys]
    assert to_verl(SEGMENTS[::-1], pad_id=PAD).non_tensor_batch["uid"].tolist() == uids[::-1]
    with pytest.raises(ValueError, match="more than"):
        to_verl(SEGMENTS, pad_id=PAD, response_length_to=4)
    assert "rm_scores" not in to_verl(UNREWARDED, pad_id=PAD).batch


@pytest.mark.parametrize(
    ("sampled", "temperature", "refused"),
    [
        ({"temperature": 0.7, "top_p": 1.0, "logprobs_mode": "processed_logprobs"}, 0.7, False),
        ({"temperature": 0.7, "top_p": 1.0}, 0.7, True),  # raw: before temperature
        ({"temperature": 1.0, "top_p": 1.0}, 0.7, True),  # not verl's rollout.temperature
    ],
)
def test_verl_refuses_logprobs_of_another_policy_than_its_actor(
    sampled: dict[str, Any], temperature: float, refused: bool
) -> None:
    """verl's actor divides the logits by ``meta_info["temperature"]``: the recorded logprobs
    must be that distribution's, and the batch carries that temperature."""
    segment = step_segment("r", ([1, 2], [10], [-0.5]))
    steps = [s.model_copy(update={"sampling": SamplingUsed(max_tokens=8, **sampled)})
             for s in segment.steps]  # fmt: skip
    segment = segment.model_copy(update={"steps": steps})
    if refused:
        with pytest.raises(ValueError, match="not verl's"):
            to_verl([segment], PAD, temperature=temperature)
    else:
        assert to_verl([segment], PAD, temperature=temperature).meta_info["temperature"] == 0.7


# --- slime / miles --------------------------------------------------------------------------


def samples_of(groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [fields for group in groups for fields in group]


@pytest.mark.parametrize("framework", ["slime", "miles"])
def test_slime_and_miles_sample_fields(framework: str) -> None:
    defined = DEFINED[framework]
    assert [member.value for member in Status] == defined["status"]
    converted = {f["metadata"]["segment_id"]: f for f in samples_of(to_slime(SEGMENTS, Status))}
    for segment in SEGMENTS:
        fields = converted[segment.segment_id]
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
        assert fields["reward"] == segment.reward and fields["status"] is Status.COMPLETED


def test_slime_status_is_the_enum_member_their_truncated_count_compares() -> None:
    cut = step_segment("cut", ([1, 2], [10], [-0.5]), reward=0.0)  # stopped at "length"
    steps = [cut.steps[0].model_copy(update={"finish_reason": "abort"})]
    aborted = step_segment("ab", ([1, 2], [10], [-0.5]), reward=0.0).model_copy(
        update={"steps": steps}
    )
    samples = samples_of(to_slime([SEGMENTS[1], cut, aborted], Status))
    # slime ray/rollout.py:664, miles ray/rollout/train_data_conversion.py:80
    assert [1 if s["status"] == Status.TRUNCATED else 0 for s in samples] == [0, 1, 0]
    assert [s["status"] for s in samples] == [Status.COMPLETED, Status.TRUNCATED, Status.ABORTED]


def test_slime_rewards_are_what_get_reward_value_reads_or_refused() -> None:
    plain = SlimeSample(**to_slime([SEGMENTS[0]], Status)[0][0])
    assert plain.get_reward_value(SimpleNamespace(reward_key=None)) == 1.0
    components_only = SEGMENTS[0].model_copy(update={"reward": None})  # {"correct": 1.0}
    keyed = SlimeSample(**to_slime([components_only], Status, reward_key="correct")[0][0])
    assert keyed.get_reward_value(SimpleNamespace(reward_key="correct")) == 1.0
    with pytest.raises(ValueError, match=r"pass reward_key= one of its components \['correct'\]"):
        to_slime([components_only], Status)
    with pytest.raises(ValueError, match=r"has no reward, .*finalize the session with a reward"):
        to_slime([UNREWARDED[0]], Status)
    with pytest.raises(ValueError, match=r"component 'score' \(it has \['correct'\]\)"):
        to_slime([SEGMENTS[0]], Status, reward_key="score")


def test_slime_groups_are_instances_and_a_session_is_one_rollout() -> None:
    """Uneven groups, a session of two segments and an unused sample: the ids say which prompt
    and which rollout each sample is, and the group normalization slime takes by
    ``--custom-reward-post-process-path`` counts each rollout of a prompt once."""
    a2 = SEGMENTS[0].model_copy(update={"segment_id": "seg-a2"})  # session a's second segment
    unused = SEGMENTS[2].model_copy(
        update={"segment_id": "seg-u", "session_id": "sess-u", "unused_sample": True}
    )
    c = SEGMENTS[2].model_copy(update={"reward": 0.0})
    groups = to_slime([SEGMENTS[0], SEGMENTS[1], unused, a2, c], Status)
    assert [[f["metadata"]["segment_id"] for f in g] for g in groups] == [
        ["seg-a", "seg-a2", "seg-c"],
        ["seg-b"],
    ]
    samples = samples_of(groups)
    assert [f["group_index"] for f in samples] == [0, 0, 0, 1]
    assert [f["index"] for f in samples] == [0, 1, 2, 3]
    assert [f["rollout_id"] for f in samples] == [0, 0, 1, 2]
    args = SimpleNamespace(
        reward_key=None,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
    )
    raw, rewards = group_normalized_rewards(args, [SlimeSample(**f) for f in samples])
    assert raw == [1.0, 1.0, 0.0, 1.0]
    spread = float(np.std([1.0, 0.0], ddof=1)) + 1e-6  # rollouts a and c, a counted once
    assert rewards == pytest.approx([0.5 / spread, 0.5 / spread, -0.5 / spread, 0.0])
    ppo = SimpleNamespace(**{**vars(args), "advantage_estimator": "ppo"})
    assert group_normalized_rewards(ppo, [SlimeSample(**f) for f in samples]) == (raw, raw)
    split = to_slime([SEGMENTS[0], a2.model_copy(update={"reward": 0.0})], Status)
    with pytest.raises(ValueError, match="rollout 0 differ in reward"):
        group_normalized_rewards(args, [SlimeSample(**f) for f in samples_of(split)])


@pytest.mark.parametrize(
    ("sampled", "temperature", "refused"),
    [
        ({"temperature": 0.7, "top_p": 1.0, "logprobs_mode": "processed_logprobs"}, 0.7, False),
        ({"temperature": 0.7, "top_p": 1.0}, 0.7, True),  # raw: before temperature
        ({"temperature": 1.0, "top_p": 1.0}, 0.7, True),  # not slime's --rollout-temperature
    ],
)
def test_slime_refuses_logprobs_of_another_policy_than_its_trainer(
    sampled: dict[str, Any], temperature: float, refused: bool
) -> None:
    segment = step_segment("r", ([1, 2], [10], [-0.5]), reward=1.0)
    steps = [s.model_copy(update={"sampling": SamplingUsed(max_tokens=8, **sampled)})
             for s in segment.steps]  # fmt: skip
    segment = segment.model_copy(update={"steps": steps})
    if refused:
        with pytest.raises(ValueError, match="not slime's"):
            to_slime([segment], Status, temperature=temperature)
    else:
        assert to_slime([segment], Status, temperature=temperature)[0][0]["tokens"] == [1, 2, 10]


# --- OpenRLHF -------------------------------------------------------------------------------


# Two prompts' groups of two, interleaved as they finish.
GROUPS = [
    SEGMENTS[0],
    filled_segment("e", [-0.25, -1.5], instance="prompt-2", reward=0.0),
    SEGMENTS[2],
    filled_segment("f", [-2.0], instance="prompt-2", reward=0.5),
]


def test_openrlhf_takes_one_experience_per_sample_group_by_group() -> None:
    """The fields of OpenRLHF's agent path, batch size 1, in its dtypes and shapes; the samples
    ordered so that each ``n_samples_per_prompt`` consecutive ones are one instance's group."""
    defined = DEFINED["openrlhf"]
    tensors = {name for name, f in defined["fields"].items() if "role" in f}
    assert defined["action_length"] == "T - 1"
    samples = to_openrlhf(GROUPS, n_samples_per_prompt=2)
    ordered = [GROUPS[0], GROUPS[2], GROUPS[1], GROUPS[3]]
    assert [s["index"] for s in samples] == [[0], [1], [2], [3]]
    for fields, segment in zip(samples, ordered, strict=True):
        n = len(segment.token_ids)
        names = {"B": 1, "T": n, "A": n - 1}  # READ: action_length T - 1
        assert set(fields) - tensors == {"index", "mm_train_inputs", "info"}
        assert fields["mm_train_inputs"] == [None]  # a text sample's, as its agent path's
        for name in set(fields) & tensors:
            array = fields[name]
            assert array.dtype == np.dtype(defined["dtypes"][name]), name
            [shape] = dims(defined["fields"][name]["comment"].split(")")[0] + ")", names)
            assert array.shape == shape, (name, array.shape, shape)
        assert fields["sequences"][0].tolist() == segment.token_ids
        assert fields["attention_mask"].tolist() == [[1] * n]
        assert fields["action_mask"][0].tolist() == [bool(m) for m in segment.loss_mask[1:]]
        assert fields["rollout_log_probs"][0].tobytes() == bits(segment, 1)
        assert fields["total_length"].tolist() == [n]
        assert fields["rewards"].tolist() == [segment.reward]
        assert fields["info"]["reward"].tolist() == [segment.reward]
        assert fields["info"]["reward"] is not fields["rewards"]  # OpenRLHF shapes one in place


def test_openrlhf_refuses_what_its_trainer_would_mix_up() -> None:
    """A group of another size (positional groups would cut across prompts), a mix of rewarded
    and unrewarded samples, logprobs of another policy than its Actor's; unused samples and
    unrewarded batches are not errors."""
    with pytest.raises(ValueError, match="instance prompt-1 has 2 samples"):
        to_openrlhf(GROUPS, n_samples_per_prompt=3)
    with pytest.raises(ValueError, match="instance prompt-2 has 1 samples"):
        to_openrlhf(GROUPS[:3], n_samples_per_prompt=2)
    with pytest.raises(ValueError, match="some segments have a reward and others none"):
        to_openrlhf(UNREWARDED, n_samples_per_prompt=1)
    unrewarded = to_openrlhf(UNREWARDED[:1], n_samples_per_prompt=1)
    assert "rewards" not in unrewarded[0] and unrewarded[0]["info"] == {}
    unused = filled_segment("u", [-1.0], instance="prompt-2").model_copy(
        update={"unused_sample": True}
    )
    assert len(to_openrlhf([*GROUPS, unused], n_samples_per_prompt=2)) == 4
    raw = step_segment("r", ([1, 2], [10], [-0.5]))
    sampled = SamplingUsed(max_tokens=8, temperature=0.7, top_p=1.0)  # raw logprobs
    steps = [s.model_copy(update={"sampling": sampled}) for s in raw.steps]
    with pytest.raises(ValueError, match=r"not OpenRLHF's log_softmax\(logits / 0\.7\)"):
        to_openrlhf([raw.model_copy(update={"steps": steps})], 1, temperature=0.7)


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
        mask = np.asarray(segment.loss_mask[1:], np.float32)
        if advantage is None:
            assert list(inputs) == defined["loss_inputs"]["cross_entropy"]
        else:  # the loss's inputs, then the mask of tinker-cookbook's Datums (train_step drops it)
            assert list(inputs) == [*defined["loss_inputs"]["importance_sampling"], "mask"]
            assert inputs.pop("mask").tobytes() == mask.tobytes()
        for name, array in inputs.items():
            assert array.dtype == np.dtype(defined["loss_fn_input_dtypes"][name]), name
            assert array.shape == (len(segment.token_ids) - 1,), name
        assert inputs["target_tokens"].tolist() == segment.token_ids[1:]
        if advantage is None:
            assert inputs["weights"].tobytes() == mask.tobytes()
        else:
            assert inputs["logprobs"].tobytes() == bits(segment, 1)
            assert inputs["advantages"].tobytes() == f32(np.where(mask > 0, advantage, 0.0))


def test_tinker_batch_is_assemble_training_datas_groups_rollouts_and_advantages() -> None:
    """Groups by instance, trajectories by rollout (a split session's two segments share one
    advantage), rewards centred per group over trajectories; unused samples left out."""
    a1 = step_segment("a1", ([1, 2], [10], [-0.5]), instance_id="p", reward=1.0)
    a2 = step_segment("a2", ([1, 2], [11], [-0.5]), instance_id="p", reward=0.0)
    split = a2.model_copy(update={"segment_id": "seg-a2b"})
    b = step_segment("b", ([3], [12], [-1.0]), instance_id="q", reward=0.5)
    unused = step_segment("u", ([1, 2], [13], [-1.0]), instance_id="p", unused_sample=True)
    data, metadata = to_tinker_batch([a1, b, a2, unused, split])
    assert metadata == [
        {"group_idx": 0, "traj_idx": 0},
        {"group_idx": 0, "traj_idx": 1},
        {"group_idx": 0, "traj_idx": 1},
        {"group_idx": 1, "traj_idx": 0},
    ]
    advantages = [float(d["loss_fn_inputs"]["advantages"][-1]) for d in data]
    assert advantages == [0.5, -0.5, -0.5, 0.0]
    with pytest.raises(ValueError, match="no reward"):
        to_tinker_batch([a1, a2.model_copy(update={"reward": None})])
    with pytest.raises(ValueError, match="differ in reward"):
        to_tinker_batch([a2, split.model_copy(update={"reward": 1.0})])
    sampled = SamplingUsed(max_tokens=8, temperature=0.7, top_p=1.0)
    hot = a1.model_copy(
        update={"steps": [s.model_copy(update={"sampling": sampled}) for s in a1.steps]}
    )
    with pytest.raises(ValueError, match=r"not Tinker's log_softmax\(logits / 1\.0\)"):
        to_tinker_batch([hot])


def test_a_trained_token_without_a_logprob_is_refused_by_every_converter() -> None:
    broken = SEGMENTS[0].model_copy(update={"logprob_source": [0] * len(SEGMENTS[0].token_ids)})
    for convert in (
        lambda: to_verl([broken], PAD),
        lambda: to_slime([broken], Status),
        lambda: to_openrlhf([broken], 1),
        lambda: to_tinker(broken, 1.0),
    ):
        with pytest.raises(ValueError, match="no engine logprob"):
            convert()


def test_the_formats_example_of_the_docs_runs_as_written() -> None:
    [example] = blocks_run_by("tests/titoflow/client/test_trainer_formats.py")
    segments = [*SEGMENTS[:2], SEGMENTS[2].model_copy(update={"reward": 0.0})]
    namespace: dict[str, Any] = {"segments": segments}
    exec(compile(example, "docs/trainer.md", "exec"), namespace)
    assert set(namespace["batch"].batch) >= {"input_ids", "response_mask", "rollout_log_probs"}
    # Grouped by instance: a and c (prompt-1, rewards 1 and 0) get +0.5 and -0.5 on their
    # generated tokens, b (alone) 0.
    by_tokens = {tuple(d["model_input"]["chunks"][0]["tokens"]): d for d in namespace["data"]}
    for segment, advantage in zip(segments, [0.5, 0.0, -0.5], strict=True):
        got = by_tokens[tuple(segment.token_ids[:-1])]["loss_fn_inputs"]["advantages"]
        assert got.tobytes() == f32(np.where(np.asarray(segment.loss_mask[1:]) > 0, advantage, 0))


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

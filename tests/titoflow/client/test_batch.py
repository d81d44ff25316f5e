"""Segments → padded training batch (titoflow/client/batch.py); the worked example of
docs/trainer.md."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from schemas.events import SegmentFinalized
from tests.support.doc_blocks import blocks_run_by
from tests.support.factories import step_segment
from titoflow.client.batch import group_by_instance, instance_key, pad_segments

PAD = 151643


def test_pads_to_the_longest_and_keeps_every_value_exact() -> None:
    lp = [-0.5, -1.25, -3.0078125]
    a = step_segment("a", ([1, 2, 3], [10, 11, 12], lp), ([13], [14, 15], [-0.1, -7.5]))
    b = step_segment("b", ([4, 5], [20], [-2.5]))
    batch = pad_segments([a, b], pad_id=PAD)

    assert set(batch) == {"input_ids", "attention_mask", "loss_mask", "old_logprobs"}
    assert {k: v.shape for k, v in batch.items()} == {k: (2, 9) for k in batch}
    assert batch["input_ids"].dtype == np.int64 and batch["attention_mask"].dtype == np.int64
    assert batch["loss_mask"].dtype == np.float32 and batch["old_logprobs"].dtype == np.float32

    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 10, 11, 12, 13, 14, 15],
        [4, 5, 20, PAD, PAD, PAD, PAD, PAD, PAD],
    ]
    assert batch["attention_mask"].tolist() == [[1] * 9, [1, 1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == [
        [0, 0, 0, 1, 1, 1, 0, 1, 1],
        [0, 0, 1, 0, 0, 0, 0, 0, 0],
    ]
    # float32 from the engine, float32 in the batch: bit for bit.
    assert batch["old_logprobs"][0, 3:6].tolist() == lp
    assert (
        batch["old_logprobs"][0, 7:].tolist() == np.array([-0.1, -7.5], dtype=np.float32).tolist()
    )
    assert batch["old_logprobs"][1].tolist() == [0, 0, -2.5, 0, 0, 0, 0, 0, 0]
    # Generated tokens are exactly the loss-masked ones, and never the first token.
    generated = batch["input_ids"][batch["loss_mask"] == 1].tolist()
    assert generated == [10, 11, 12, 14, 15, 20]
    assert not batch["loss_mask"][:, 0].any()


def test_pad_to_multiple_of() -> None:
    batch = pad_segments([step_segment("a", ([1, 2], [3], [-1.0]))], pad_id=0, pad_to_multiple_of=8)
    assert batch["input_ids"].shape == (1, 8)
    assert batch["input_ids"][0].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]


def test_refuses_what_would_train_silently_wrong() -> None:
    with pytest.raises(ValueError, match="no segments"):
        pad_segments([], pad_id=0)
    good = step_segment("a", ([1, 2], [3, 4], [-1.0, -2.0]))
    # A generated token whose logprob was never reported (source 0): not trainable as is.
    no_logprob = good.model_copy(update={"logprob_source": [0, 0, 1, 0]})
    with pytest.raises(ValueError, match="no engine logprob"):
        pad_segments([good, no_logprob], pad_id=0)
    misaligned = good.model_copy(update={"loss_mask": [0, 0, 1]})
    with pytest.raises(ValueError, match="not aligned"):
        pad_segments([misaligned], pad_id=0)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        pad_segments([good], pad_id=0, pad_to_multiple_of=0)


def test_the_wire_form_decodes_to_the_same_batch_with_numpy_alone() -> None:
    """What a non-Python-model consumer does: JSON + base64 + little-endian arrays."""
    original = step_segment("a", ([7, 8, 9], [100, 101], [-0.25, -4.5]))
    raw = original.model_dump_json().encode()
    event = json.loads(raw)
    assert isinstance(event["token_ids"], str)  # packed, not a JSON list
    token_ids = np.frombuffer(base64.b64decode(event["token_ids"]), dtype="<i4")
    logprobs = np.frombuffer(base64.b64decode(event["logprobs"]), dtype="<f4")
    loss_mask = np.frombuffer(base64.b64decode(event["loss_mask"]), dtype="u1")
    batch = pad_segments([SegmentFinalized.model_validate_json(raw)], pad_id=0)
    assert batch["input_ids"][0].tolist() == token_ids.tolist()
    assert batch["old_logprobs"][0].tolist() == logprobs.tolist()
    assert batch["loss_mask"][0].tolist() == loss_mask.tolist()


def test_groups_by_instance_falling_back_to_the_session() -> None:
    a1 = step_segment("a1", ([1], [2], [-1.0]), instance_id="prompt-7")
    b = step_segment("b", ([1], [2], [-1.0]))
    a2 = step_segment("a2", ([1], [3], [-1.0]), instance_id="prompt-7")
    groups = group_by_instance([a1, b, a2])
    assert groups == {"prompt-7": [a1, a2], "sess-b": [b]}
    assert instance_key(b) == "sess-b"


def _doc_examples() -> list[str]:
    """The python blocks of docs/trainer.md marked ``<!-- tested by
    tests/titoflow/client/test_batch.py -->``."""
    return blocks_run_by("tests/titoflow/client/test_batch.py")


def test_the_trainer_doc_example_runs() -> None:
    [example] = _doc_examples()
    group = [
        step_segment("r0", ([1, 2, 3], [10, 11], [-1.0, -2.0]), instance_id="prompt-1"),
        step_segment("r1", ([1, 2, 3], [12, 13, 14], [-0.5, -0.5, -0.5]), instance_id="prompt-1"),
        step_segment("r2", ([4, 5], [15], [-3.0]), instance_id="prompt-2"),
    ]
    namespace: dict[str, Any] = {
        "segments": group,
        "rewards": {"seg-r0": 1.0, "seg-r1": 0.0, "seg-r2": 0.5},
        "pad_id": PAD,
    }
    exec(compile(example, "docs/trainer.md", "exec"), namespace)
    batch, advantages = namespace["batch"], namespace["advantages"]
    assert batch["input_ids"].shape == (3, 8)  # 6 tokens, padded to a multiple of 8
    # Group-relative: prompt-1's two rollouts get +-1 around their mean; prompt-2's only one 0.
    assert advantages.dtype == np.float32
    assert np.allclose(advantages, [1.0, -1.0, 0.0], atol=1e-5)

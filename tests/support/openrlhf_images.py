"""OpenRLHF's own batching and VLM ``Actor`` forward on the images ``to_openrlhf`` carries, run in
.venv-openrlhf (scripts/setup-openrlhf.sh, OpenRLHF 0.11.2) by
tests/titoflow/client/test_image_inputs.py:

    .venv-openrlhf/bin/python -m tests.support.openrlhf_images INPUT.pkl OUTPUT.json

INPUT holds the samples (a text sample and samples with images, ``mm_train_inputs`` as torch
tensors), the doc's block that turns them into ``Experience``s, the tiny VL policy's directory
and the pad id. The experiences go through what OpenRLHF does with them: ``concat_experiences``
and ``split_experience_batch`` (its replay buffer's), ``remove_padding_in_sequences`` and
``make_experience_batch`` (its collation), ``merge_mm_train_inputs`` (what its actor runs before
the forward), and ``Actor.forward``'s VLM path on the tiny Qwen3-VL (it rebuilds
``mm_token_type_ids`` from the sequences; the model scatters the vision tower's output over the
placeholder ids and raises when their counts differ). OUTPUT says, per check, whether each
sample kept its own images, and whether the forward's log probs depend on the pixels (zeroed
pixels give others after the first image). GPU-only modules are stubbed as in
tests/support/openrlhf_step.py; the ``Actor`` wraps the loaded model as OpenRLHF's loader does for a
VLM (``is_vlm``, ``_vlm_config``), which it sets only when it loads the weights itself.
"""

from __future__ import annotations

import json
import math
import pickle
import sys
from pathlib import Path
from typing import Any

import torch

from tests.support.openrlhf_step import import_openrlhf


def same(a: Any, b: Any) -> bool:
    """Equal per-sample ``mm_train_inputs`` entries: None, or dicts of equal tensors."""
    if a is None or b is None:
        return a is b
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def main(source: Path, target: Path) -> None:
    data = pickle.loads(source.read_bytes())
    o = import_openrlhf()
    from openrlhf.utils.vlm_utils import merge_mm_train_inputs
    from transformers import AutoModelForImageTextToText

    namespace: dict[str, Any] = {"samples": data["samples"]}
    exec(compile(data["block"], "docs/trainer.md", "exec"), namespace)
    experiences = namespace["experiences"]
    given = [e.mm_train_inputs[0] for e in experiences]

    out: dict[str, Any] = {}
    merged = o.Experience.concat_experiences(experiences, data["pad_token_id"])
    out["concat"] = len(merged.mm_train_inputs) == len(given) and all(
        same(a, b) for a, b in zip(merged.mm_train_inputs, given, strict=True)
    )
    items = o.split_experience_batch(merged)
    out["split"] = all(
        len(item.mm_train_inputs) == 1 and same(item.mm_train_inputs[0], g)
        for item, g in zip(items, given, strict=True)
    )
    batch = o.make_experience_batch(o.remove_padding_in_sequences(items))
    inputs = merge_mm_train_inputs(batch.mm_train_inputs, "cpu")
    images = [g for g in given if g is not None]
    out["merged"] = set(inputs) == {"pixel_values", "image_grid_thw"} and all(
        torch.equal(inputs[k], torch.cat([g[k] for g in images])) for k in inputs
    )

    model = AutoModelForImageTextToText.from_pretrained(data["model"], dtype=torch.float32)
    actor = o.Actor(model, temperature=1.0)
    actor.packing_samples = False
    actor.is_vlm = True
    actor._vlm_config = model.config
    with torch.no_grad():
        logprobs = actor(batch.sequences, batch.action_mask, batch.attention_mask, **inputs)
        blank = dict(inputs, pixel_values=torch.zeros_like(inputs["pixel_values"]))
        blind = actor(batch.sequences, batch.action_mask, batch.attention_mask, **blank)
    out["shape"] = list(logprobs.shape) == list(batch.action_mask.shape)
    out["finite"] = all(math.isfinite(v) for v in logprobs[batch.action_mask].tolist())
    # Per row: whether the pixels moved any generated token's log prob.
    out["moved_by_pixels"] = [
        bool((logprobs[row] - blind[row])[batch.action_mask[row]].abs().max() > 0)
        for row in range(len(given))
    ]
    target.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

"""tinker's types and tinker-cookbook's RL data path on the image chunks ``to_tinker_batch`` makes,
run in .venv-tinker (scripts/setup-tinker.sh: tinker 0.38.0, tinker-cookbook 0.6.1) by
tests/titoflow/client/test_image_inputs.py:

    .venv-tinker/bin/python tests/support/tinker_images.py INPUT.pkl OUTPUT.json

INPUT holds what ``to_tinker_batch`` made (``data``), the same sessions as a cookbook rollout
records them (per step its observation, text ids and images as ``ImageChunk`` fields with the
stored bytes, its sampled tokens and logprobs; the reward per trajectory) and the tiny VL
policy's directory. OUTPUT says, per check, whether titoflow's datums are tinker ``Datum``s whose
``model_input`` is as long as every ``loss_fn_inputs`` array; whether they equal, chunk by chunk
and array by array (bit for bit), the ones cookbook's ``compute_advantages`` and
``assemble_training_data`` make from those sessions, an image's bytes compared as the upright
pixels they decode to (PIL's ``exif_transpose``, as the engine saw them); and whether each image
chunk's ``expected_tokens`` is what cookbook's ``image_to_chunk`` counts for its bytes with the
policy's image processor.
"""

from __future__ import annotations

import io
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tinker
from PIL import Image, ImageOps


def observation(elements: list[Any]) -> tinker.ModelInput:
    """Ids and ``ImageChunk`` fields → a ``ModelInput``, consecutive ids one text chunk."""
    chunks: list[Any] = []
    for element in elements:
        if isinstance(element, dict):
            chunks.append(tinker.types.ImageChunk(**element))
        elif chunks and isinstance(chunks[-1], list):
            chunks[-1].append(element)
        else:
            chunks.append([element])
    return tinker.ModelInput(
        chunks=[tinker.EncodedTextChunk(tokens=c) if isinstance(c, list) else c for c in chunks]
    )


def cookbook_groups(groups: list[list[dict[str, Any]]]) -> list[Any]:
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

    made = []
    for group in groups:
        trajectories = [
            Trajectory(
                [
                    Transition(
                        ob=observation(ob),
                        ac=TokensWithLogprobs(tokens=tokens, maybe_logprobs=logprobs),
                        reward=0.0,
                        episode_done=i == len(t["steps"]) - 1,
                    )
                    for i, (ob, tokens, logprobs) in enumerate(t["steps"])
                ],
                final_ob=tinker.ModelInput.empty(),
            )
            for t in group
        ]
        made.append(TrajectoryGroup(trajectories, [t["reward"] for t in group], [{}] * len(group)))
    return made


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


def same_chunk(a: Any, b: Any) -> bool:
    if a.type != b.type:
        return False
    if a.type != "image":
        return bool(a.model_dump() == b.model_dump())
    return bool(
        a.expected_tokens == b.expected_tokens and np.array_equal(pixels(a.data), pixels(b.data))
    )


def same_datum(a: Any, b: Any) -> bool:
    ours, theirs = a.model_input.chunks, b.model_input.chunks
    if len(ours) != len(theirs) or not all(map(same_chunk, ours, theirs)):
        return False
    if list(a.loss_fn_inputs) != list(b.loss_fn_inputs):
        return False
    for key, value in a.loss_fn_inputs.items():
        x, y = value.to_numpy(), b.loss_fn_inputs[key].to_numpy()
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def main(source: Path, target: Path) -> None:
    given = pickle.loads(source.read_bytes())
    from tinker_cookbook.renderers.base import image_to_chunk
    from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
    from transformers import Qwen2VLImageProcessorPil

    data = [
        tinker.Datum(
            model_input=tinker.ModelInput.model_validate(d["model_input"]),
            loss_fn_inputs=d["loss_fn_inputs"],
        )
        for d in given["data"]
    ]
    groups = cookbook_groups(given["groups"])
    theirs, _ = assemble_training_data(groups, compute_advantages(groups), include_provenance=False)
    # The policy's processor class in its PIL form: .venv-tinker has no torchvision, and the
    # two backends give the same grid.
    processor = Qwen2VLImageProcessorPil.from_pretrained(given["policy_path"])
    chunks = [c for d in data for c in d.model_input.chunks if c.type == "image"]
    out = {
        "images": len(chunks),
        "aligned": all(
            d.model_input.length == v.shape[0] for d in data for v in d.loss_fn_inputs.values()
        ),
        "cookbook": len(data) == len(theirs) and all(map(same_datum, data, theirs)),
        "expected_tokens": [
            image_to_chunk(Image.open(io.BytesIO(c.data)), processor).expected_tokens
            == c.expected_tokens
            for c in chunks
        ],
    }
    target.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

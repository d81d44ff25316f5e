"""What a packed item's images and M-RoPE positions must hold (titoflow/client/torch_data.py's
``SegmentDataset`` with an image store, ``mrope=True``), checked by the image-input tests and the
end-to-end image test: its segments' images in row-major token order, each run located, and
each segment's positions its model's own ``get_rope_index`` of it alone.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from cli.dev.vl_policy import IMAGE_PAD_ID
from schemas.events import SegmentFinalized
from tests.support.chat_images import PROCESSING
from tests.support.image_samples import runs
from titoflow.client.image_inputs import image_inputs

FINGERPRINT = PROCESSING.fingerprint("5.19.0")


def check_item_images(item: dict[str, Any], segments: list[SegmentFinalized], store: Any) -> None:
    """The item's images are its segments' in row-major token order, each run located."""
    holding = [s for s in segments if s.images]
    if not holding:
        assert not {"pixel_values", "image_grid_thw", "image_sequence_ids", "image_runs"} & set(
            item
        )
        return
    each = [image_inputs(s, store) for s in holding]
    assert torch.equal(
        item["pixel_values"], torch.from_numpy(np.concatenate([i.pixel_values for i in each]))
    )
    assert item["image_grid_thw"].tolist() == [g for i in each for g in i.image_grid_thw.tolist()]
    assert item["image_grid_thw"].dtype == torch.int64
    ids, sequence_ids = item["input_ids"], item["sequence_ids"]
    expected_runs = [
        [row, start, length]
        for row in range(ids.shape[0])
        for start, length in runs(ids[row].tolist())
    ]
    assert item["image_runs"].tolist() == expected_runs  # row-major: the forward's order
    for (row, start, length), sequence in zip(
        item["image_runs"].tolist(), item["image_sequence_ids"].tolist(), strict=True
    ):
        assert (sequence_ids[row, start : start + length] == sequence).all()
        assert (ids[row, start : start + length] == IMAGE_PAD_ID).all()
    # The vision tower's patches cover the pads: one token per merge_size^2 patches.
    patches = item["image_grid_thw"].prod(dim=1)
    assert item["pixel_values"].shape[0] == int(patches.sum())
    assert (patches // FINGERPRINT.merge_size**2).tolist() == item["image_runs"][:, 2].tolist()


def qwen3_vl_rope_index(policy: Path) -> Any:
    """The Qwen3-VL policy's own ``get_rope_index`` (transformers), as verl binds it."""
    return bound(transformers.Qwen3VLModel, transformers.AutoConfig.from_pretrained(policy))


def check_item_positions(
    item: dict[str, Any], segments: list[SegmentFinalized], get_rope_index: Any
) -> None:
    """``mrope=True``: ``[4, rows, length]``, the text positions (0, 1, ... restarting with each
    segment), then at each segment's place the model's ``get_rope_index`` of it alone; 0 on
    padding."""
    positions, sequence_ids = item["position_ids"], item["sequence_ids"]
    assert positions.dtype == torch.int64
    assert positions.shape == (4, *item["input_ids"].shape)
    assert (positions[:, sequence_ids < 0] == 0).all()
    for index, segment in enumerate(segments):
        at = sequence_ids == index
        ids = torch.tensor([segment.token_ids])
        # The images' grids in token order (the records may be listed in another).
        grids = [r.grid_thw for r in sorted(segment.images, key=lambda r: r.offset)]
        expected, _ = get_rope_index(
            input_ids=ids,
            mm_token_type_ids=(ids == IMAGE_PAD_ID).int(),
            image_grid_thw=torch.tensor(grids) if grids else None,
        )
        assert positions[0][at].tolist() == list(range(len(segment.token_ids)))
        assert positions[1:, at].tolist() == expected[:, 0].tolist()


def bound(model_class: Any, config: Any) -> Any:
    """The model's ``get_rope_index`` on a stand-in holding its config, as verl binds it to the
    processor (verl/utils/tokenizer.py ``hf_processor``): the method needs nothing else."""
    stand_in = types.SimpleNamespace(config=config)
    stand_in.get_vision_position_ids = types.MethodType(
        model_class.get_vision_position_ids, stand_in
    )
    return types.MethodType(model_class.get_rope_index, stand_in)

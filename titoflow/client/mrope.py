"""A segment's M-RoPE positions: the (time, height, width) rotary position ids a Qwen2-VL,
Qwen2.5-VL or Qwen3-VL forward pass gives each of its tokens, from its image records, in numpy.

Invariant: equal to the model's own ``get_rope_index`` (transformers' ``Qwen2VLModel``,
``Qwen2_5_VLModel`` and ``Qwen3VLModel``) on ``token_ids`` and the images' ``image_grid_thw``.
Text advances all three rows by one per token. An image's run (``offset``, ``length``) of
``(h / m) · (w / m)`` placeholder ids, ``m`` its processor's ``merge_size``, starts at the
position ``p`` the text before it reached: time ``p`` (an image is one temporal patch), height
``p + row`` and width ``p + column`` of its merged grid, row-major; the text after it resumes at
``p + max(h, w) / m``. A record whose run is not its grid's merged patches, overlaps the one
before it or ends past ``token_ids``, or whose image has more than one temporal patch (where
Qwen2-VL and Qwen2.5-VL count time differently), raises ValueError.
"""

from __future__ import annotations

import numpy as np

from schemas.events import SegmentFinalized


def mrope_position_ids(segment: SegmentFinalized) -> np.ndarray:
    """int64 ``[3, len(token_ids)]``: rows time, height, width (text alone: 0, 1, 2, ... in
    each)."""
    size = len(segment.token_ids)
    positions = np.empty((3, size), dtype=np.int64)
    at = position = 0  # the next token, and the position its text starts at
    for record in sorted(segment.images, key=lambda record: record.offset):
        t, h, w = record.grid_thw
        rows, columns = h // record.processor.merge_size, w // record.processor.merge_size
        end = record.offset + record.length
        if t != 1 or record.length != rows * columns or record.offset < at or end > size:
            raise ValueError(
                f"segment {segment.segment_id}: image {record.sha256}'s run [{record.offset}, "
                f"{end}) is not its grid_thw {record.grid_thw} merged by "
                f"{record.processor.merge_size}, one temporal patch, after the image before it "
                f"(ending at {at}) and inside the {size} tokens"
            )
        positions[:, at : record.offset] = position + np.arange(record.offset - at)
        position += record.offset - at
        height, width = np.indices((rows, columns)).reshape(2, -1)
        positions[0, record.offset : end] = position
        positions[1, record.offset : end] = position + height
        positions[2, record.offset : end] = position + width
        position += max(rows, columns)
        at = end
    positions[:, at:] = position + np.arange(size - at)
    return positions

"""A segment's images → the vision inputs of a Qwen2/2.5/3-VL forward pass: ``pixel_values`` and
``image_grid_thw``, the images in token order.

Invariants:
- Images are in the order of their runs in ``token_ids`` (by ``offset``), which is the order
  Qwen2-VL's forward scatters the vision tower's output over the image placeholder ids in; each
  image's ``pixel_values`` are its processor's output rows (``t*h*w`` of them), concatenated.
- An image's processor output (:func:`~titoflow.client.image_processor.process_image`: its
  stored bytes through its fingerprint's processor) must give the record's ``grid_thw`` and
  placeholder count, and its run must lie inside ``token_ids`` as one repeated id, the runs
  apart: otherwise :class:`ImageMismatch` names the image's sha256 and what differs. Pixels that
  do not match the recorded tokens are never handed out.

Needs transformers' image processors (numpy, PIL); torch is not imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from schemas.events import SegmentFinalized
from schemas.images import ImageRecord
from titoflow.client.image_check import compared
from titoflow.client.image_processor import ProcessedImage, process_image
from titoflow.image_store import ImageStore


class ImageMismatch(ValueError):
    """A recorded image whose processed pixels do not fit its placeholder run."""


@dataclass(frozen=True)
class ImageInputs:
    """The vision inputs of one segment, its images in token order (``records``)."""

    pixel_values: np.ndarray  # float32 [sum of t*h*w, channels * temporal_patch * patch^2]
    image_grid_thw: np.ndarray  # int64 [images, 3]
    records: tuple[ImageRecord, ...]


def image_inputs(segment: SegmentFinalized, store: ImageStore) -> ImageInputs:
    """The vision inputs of ``segment``'s images, read from ``store``. A segment without images
    gives ``pixel_values`` of shape ``[0, 0]`` and ``image_grid_thw`` ``[0, 3]``.
    :class:`ImageMismatch` (a ValueError): an image's grid or run differs from its record;
    FileNotFoundError: the store does not hold an image; ValueError: its bytes are not it."""
    records = tuple(sorted(segment.images, key=lambda record: record.offset))
    _check_runs(segment, records)
    processed: dict[tuple[str, str], ProcessedImage] = {}  # an image repeated is processed once
    pixels: list[np.ndarray] = []
    for record in records:
        key = (record.sha256, record.processor.sha256)
        if key not in processed:
            processed[key] = process_image(record, store)
        image = processed[key]
        differences = compared(record, image).differences
        if differences:
            raise ImageMismatch(
                f"segment {segment.segment_id}: image {record.sha256} at token {record.offset} "
                f"does not match its record: {'; '.join(differences)} (processor "
                f"{image.processor.class_name} on {image.processor.backend}, fingerprint "
                f"{record.processor.sha256})"
            )
        pixels.append(image.pixel_values)
    return ImageInputs(
        pixel_values=(
            np.concatenate(pixels, axis=0) if pixels else np.zeros((0, 0), dtype=np.float32)
        ),
        image_grid_thw=np.array([r.grid_thw for r in records], dtype=np.int64).reshape(-1, 3),
        records=records,
    )


def _check_runs(segment: SegmentFinalized, records: Sequence[ImageRecord]) -> None:
    """Each run inside ``token_ids``, one id repeated, after the one before it."""
    end = 0
    for record in records:
        problem = _run_problem(record, segment.token_ids, end)
        if problem is not None:
            raise ImageMismatch(
                f"segment {segment.segment_id}: image {record.sha256} does not match its "
                f"tokens: {problem}"
            )
        end = record.offset + record.length


def _run_problem(record: ImageRecord, ids: Sequence[int], end: int) -> str | None:
    span = f"[{record.offset}, {record.offset + record.length})"
    if record.offset < end:
        return f"its run {span} overlaps the image before it, which ends at {end}"
    run = ids[record.offset : record.offset + record.length]
    if len(run) != record.length:
        return f"its run {span} is past the segment's {len(ids)} tokens"
    if len(set(run)) != 1:
        return f"its run {span} holds ids {sorted(set(run))}, not one placeholder id repeated"
    return None

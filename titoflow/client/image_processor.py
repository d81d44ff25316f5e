"""A recorded image through the processor its fingerprint names, as the engine ran it: the one
place the trainer side builds that processor and feeds it (the check of
:mod:`titoflow.client.image_check` and the model inputs of :mod:`titoflow.client.image_inputs`).

Invariants:
- The bytes processed are the ones the record names: :meth:`~titoflow.image_store.ImageStore.get`
  refuses a file whose bytes do not hash to the record's sha256; a missing one raises
  FileNotFoundError naming the sha256 and the store's directory.
- The processor run is the record's fingerprint's class with the fingerprint's parameters, on
  the image turned upright by its EXIF orientation and converted to RGB first, as vLLM does
  before its processor. It runs on the fingerprint's backend where it can; torchvision is an
  engine dependency, not a trainer's, so without it the class's PIL twin runs (transformers 5:
  ``<class>Pil``), and :attr:`Processor.backend` says which ran. The two resize pixels slightly
  differently; they give the same grid.
- One processor instance per fingerprint and process (:func:`processor_for` caches them): a
  dataset sees many images under one fingerprint.

Needs transformers (a titoflow dependency) and its image processors' numpy and PIL; torch is not
imported here.
"""

from __future__ import annotations

import functools
import importlib.util
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import transformers
from PIL import Image, ImageOps

from schemas.images import ImageProcessorFingerprint, ImageRecord
from titoflow.image_store import ImageStore


@dataclass(frozen=True)
class Processor:
    """A fingerprint's image processor, built: the transformers instance and what it is."""

    processor: Any  # the transformers image processor instance
    class_name: str  # the class that runs
    backend: str  # the backend it runs on: "torchvision" or "pil"


@dataclass(frozen=True)
class ProcessedImage:
    """One image's processor output: what the vision tower takes, and its grid."""

    pixel_values: np.ndarray  # float32 [t*h*w, channels * temporal_patch * patch^2]
    grid_thw: tuple[int, int, int]
    length: int  # placeholder ids the grid makes: t*h*w / merge_size^2
    processor: Processor


@functools.lru_cache(maxsize=16)
def processor_for(fingerprint: ImageProcessorFingerprint) -> Processor:
    """The processor ``fingerprint`` names with its parameters, built once per fingerprint."""
    processor_class, backend = _processor_class(fingerprint)
    instance = processor_class(
        size={"shortest_edge": fingerprint.min_pixels, "longest_edge": fingerprint.max_pixels},
        patch_size=fingerprint.patch_size,
        merge_size=fingerprint.merge_size,
        temporal_patch_size=fingerprint.temporal_patch_size,
        image_mean=fingerprint.image_mean,
        image_std=fingerprint.image_std,
        rescale_factor=fingerprint.rescale_factor,
        resample=fingerprint.resample,
    )
    return Processor(instance, processor_class.__name__, backend)


def process_image(record: ImageRecord, store: ImageStore) -> ProcessedImage:
    """Run ``record``'s processor on its stored bytes. FileNotFoundError: the store does not hold
    the image; ValueError: its bytes are not the record's."""
    try:
        data = store.get(record.sha256)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"image {record.sha256} is not in the image store {store.root} (the trainer reads "
            "the directory the ingress wrote: its TITOFLOW_IMAGE_STORE_DIR)"
        ) from exc
    with Image.open(io.BytesIO(data)) as opened:
        image = ImageOps.exif_transpose(opened).convert("RGB")
    processor = processor_for(record.processor)
    out = processor.processor(images=[image], return_tensors="np")
    t, h, w = (int(n) for n in out["image_grid_thw"][0])
    return ProcessedImage(
        pixel_values=np.asarray(out["pixel_values"], dtype=np.float32),
        grid_thw=(t, h, w),
        length=t * h * w // record.processor.merge_size**2,
        processor=processor,
    )


def _processor_class(fingerprint: ImageProcessorFingerprint) -> tuple[Any, str]:
    """The installed transformers' class for ``fingerprint`` and its backend: the recorded one
    where torchvision is installed, else the PIL one."""
    name = fingerprint.processor_class
    major = int(transformers.__version__.split(".", 1)[0])
    if fingerprint.backend == "torchvision" and importlib.util.find_spec("torchvision"):
        return getattr(transformers, name if major >= 5 else f"{name}Fast"), "torchvision"
    return getattr(transformers, f"{name}Pil" if major >= 5 else name), "pil"

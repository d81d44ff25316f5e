"""The trainer's check of a recorded image: its bytes, read back from the image store, run
through the pinned processor again must give the grid and the placeholder count the record
says the engine's processor gave.

Invariants:
- The bytes checked are the ones the record names: :meth:`~titoflow.image_store.ImageStore.get`
  refuses a file whose bytes do not hash to the record's sha256.
- The processor run is the record's fingerprint's class with the fingerprint's parameters, on
  the image turned upright by its EXIF orientation first, as vLLM does before its processor.
  It runs on the fingerprint's backend where it can; torchvision is an engine dependency, not a
  trainer's, so without it the class's PIL twin runs (transformers 5: ``<class>Pil``), and
  :attr:`ImageCheck.backend` says which ran. The two resize pixels slightly differently; they
  give the same grid, which is what is compared.
- A mismatch is returned (:attr:`ImageCheck.differences`), never hidden; a missing or corrupt
  file raises.

Needs transformers (a titoflow dependency) and its image processors' numpy and PIL; torch is not
imported here.
"""

from __future__ import annotations

import importlib.util
import io
from dataclasses import dataclass
from typing import Any

import transformers
from PIL import Image, ImageOps

from schemas.images import ImageProcessorFingerprint, ImageRecord
from titoflow.image_store import ImageStore


@dataclass(frozen=True)
class ImageCheck:
    """What the processor found for one recorded image, beside what the record says."""

    sha256: str
    recorded_grid_thw: tuple[int, int, int]
    grid_thw: tuple[int, int, int]
    recorded_length: int
    length: int  # placeholder ids the processor's grid makes: t*h*w / merge_size^2
    processor_class: str  # the class that ran
    backend: str  # the backend it ran on

    @property
    def differences(self) -> list[str]:
        """What differs from the record (empty: the image checks out)."""
        found = []
        if self.grid_thw != self.recorded_grid_thw:
            found.append(f"grid_thw {self.grid_thw} != recorded {self.recorded_grid_thw}")
        if self.length != self.recorded_length:
            found.append(f"{self.length} placeholder ids != recorded {self.recorded_length}")
        return found

    @property
    def ok(self) -> bool:
        return not self.differences


def check_image(record: ImageRecord, store: ImageStore) -> ImageCheck:
    """Re-run ``record``'s processor on its stored bytes and compare grid and placeholder count.
    FileNotFoundError: the store does not hold the image; ValueError: its bytes are not the
    record's."""
    data = store.get(record.sha256)
    with Image.open(io.BytesIO(data)) as opened:
        image = ImageOps.exif_transpose(opened).convert("RGB")
    fingerprint = record.processor
    processor_class, backend = _processor_class(fingerprint)
    processor = processor_class(
        size={"shortest_edge": fingerprint.min_pixels, "longest_edge": fingerprint.max_pixels},
        patch_size=fingerprint.patch_size,
        merge_size=fingerprint.merge_size,
        temporal_patch_size=fingerprint.temporal_patch_size,
        image_mean=fingerprint.image_mean,
        image_std=fingerprint.image_std,
        rescale_factor=fingerprint.rescale_factor,
        resample=fingerprint.resample,
    )
    t, h, w = (int(n) for n in processor(images=[image], return_tensors="np")["image_grid_thw"][0])
    return ImageCheck(
        sha256=record.sha256,
        recorded_grid_thw=record.grid_thw,
        grid_thw=(t, h, w),
        recorded_length=record.length,
        length=t * h * w // fingerprint.merge_size**2,
        processor_class=processor_class.__name__,
        backend=backend,
    )


def _processor_class(fingerprint: ImageProcessorFingerprint) -> tuple[Any, str]:
    """The installed transformers' class for ``fingerprint`` and its backend: the recorded one
    where torchvision is installed, else the PIL one."""
    name = fingerprint.processor_class
    major = int(transformers.__version__.split(".", 1)[0])
    if fingerprint.backend == "torchvision" and importlib.util.find_spec("torchvision"):
        return getattr(transformers, name if major >= 5 else f"{name}Fast"), "torchvision"
    return getattr(transformers, f"{name}Pil" if major >= 5 else name), "pil"

"""The trainer's check of a recorded image: its bytes, read back from the image store, run
through the pinned processor again must give the grid and the placeholder count the record
says the engine's processor gave.

Invariants:
- The bytes and the processor run are :mod:`titoflow.client.image_processor`'s: the record's
  bytes (hash checked), upright and RGB, through the fingerprint's class and parameters on its
  backend where installed, else the class's PIL twin (:attr:`ImageCheck.backend` says which
  ran). The two backends resize pixels slightly differently; they give the same grid, which is
  what is compared.
- A mismatch is returned (:attr:`ImageCheck.differences`), never hidden; a missing or corrupt
  file raises.

Needs transformers (a titoflow dependency) and its image processors' numpy and PIL; torch is not
imported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.images import ImageRecord
from titoflow.client.image_processor import ProcessedImage, process_image
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
    return compared(record, process_image(record, store))


def compared(record: ImageRecord, processed: ProcessedImage) -> ImageCheck:
    """What the processor made of ``record``'s image (``processed``), beside the record."""
    return ImageCheck(
        sha256=record.sha256,
        recorded_grid_thw=record.grid_thw,
        grid_thw=processed.grid_thw,
        recorded_length=record.length,
        length=processed.length,
        processor_class=processed.processor.class_name,
        backend=processed.processor.backend,
    )

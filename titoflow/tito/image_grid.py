"""How many placeholder ids an image becomes, known before the engine is called: the canonical
prompt holds each image as its expanded run, so the renderer computes the run's length the way
the engine's processor will (Qwen2-VL, 2.5-VL and 3-VL's image processor, torch-free).

The processor resizes an image to the multiples of ``patch_size * merge_size`` closest to its
size, scaled into ``[min_pixels, max_pixels]`` (transformers' ``smart_resize``), cuts it into
``patch_size`` patches (an image is one temporal patch: ``grid_t`` 1) and merges
``merge_size``x``merge_size`` patches into one token. vLLM first turns the image upright by its
EXIF orientation (``normalize_image``), so a photo stored sideways is measured upright here too.

Invariant: the numbers depend only on the model directory's ``preprocessor_config.json`` and the
image's upright size; the engine's expansion is still checked against them on every call
(titoflow/engine/image_expansion.py). The processor's fingerprint
(:meth:`ImageProcessing.fingerprint`, recorded with every image) is read from the same file, plus
the engines' transformers version, which no model directory holds (a setting; ``up`` reads it with
:func:`installed_version`).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from schemas.images import ImageProcessorFingerprint

# EXIF orientations that turn the image a quarter (PIL's ImageOps.exif_transpose: transpose,
# rotate 270, transverse, rotate 90), so the upright image has width and height swapped.
_QUARTER_TURNS = {5, 6, 7, 8}
_ORIENTATION_TAG = 0x0112


@dataclass(frozen=True)
class ImageProcessing:
    """A Qwen-VL processor config: the part that fixes an image's grid, and the rest of what
    its fingerprint names (defaults: transformers' Qwen2VLImageProcessor's)."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    processor_class: str = "Qwen2VLImageProcessor"
    temporal_patch_size: int = 2
    image_mean: tuple[float, ...] = (0.48145466, 0.4578275, 0.40821073)  # OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = (0.26862954, 0.26130258, 0.27577711)  # OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL's BICUBIC

    @classmethod
    def of_model(cls, model_dir: Path) -> ImageProcessing | None:
        """The model's image processing, None when it has no ``preprocessor_config.json``."""
        try:
            config = json.loads((model_dir / "preprocessor_config.json").read_text("utf-8"))
        except FileNotFoundError:
            return None
        return cls.of_config(config)

    @classmethod
    def of_config(cls, config: dict[str, Any]) -> ImageProcessing:
        """The image processing a ``preprocessor_config.json``'s content describes."""
        size = config.get("size") or {}
        return cls(
            patch_size=int(config["patch_size"]),
            merge_size=int(config["merge_size"]),
            min_pixels=int(size.get("shortest_edge", config.get("min_pixels", 0))),
            max_pixels=int(size.get("longest_edge", config.get("max_pixels", 0))),
            **{
                field: read(config[key])
                for key, (field, read) in _FINGERPRINTED.items()
                if config.get(key) is not None
            },
        )

    def fingerprint(self, transformers_version: str) -> ImageProcessorFingerprint:
        """What a trainer needs to re-run this processing as the engine ran it: these values,
        the backend the engine's transformers runs the class on, and that version."""
        major = transformers_version.split(".", 1)[0]
        return ImageProcessorFingerprint(
            processor_class=self.processor_class,
            # transformers 5 names the torchvision class plainly (the PIL one <class>Pil);
            # transformers 4 names the PIL one plainly (the torchvision one <class>Fast).
            backend="pil" if major.isdigit() and int(major) < 5 else "torchvision",
            patch_size=self.patch_size,
            merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            image_mean=self.image_mean,
            image_std=self.image_std,
            rescale_factor=self.rescale_factor,
            resample=self.resample,
            transformers_version=transformers_version,
        )

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """transformers' ``smart_resize``: the (height, width) the processor resizes to."""
        factor = self.patch_size * self.merge_size
        if max(height, width) / min(height, width) > 200:
            raise ValueError(f"a {width}x{height} image is over 200 times as long as it is wide")
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The image's patch grid (time, height, width), as the processor reports it."""
        h_bar, w_bar = self.resized(height, width)
        return 1, h_bar // self.patch_size, w_bar // self.patch_size

    def tokens(self, height: int, width: int) -> int:
        """How many placeholder ids the image expands to."""
        t, h, w = self.grid_thw(height, width)
        return t * h * w // self.merge_size**2


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in value)


# preprocessor_config.json keys a fingerprint names beside the grid's: the field each sets, and
# how its value is read.
_FINGERPRINTED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "image_processor_type": ("processor_class", str),
    "temporal_patch_size": ("temporal_patch_size", int),
    "image_mean": ("image_mean", _floats),
    "image_std": ("image_std", _floats),
    "rescale_factor": ("rescale_factor", float),
    "resample": ("resample", int),
}


def installed_version(python: Path, distribution: str) -> str:
    """The version of ``distribution`` installed in the virtual environment of ``python``
    (``<venv>/bin/python``), read from its metadata directory without running it; empty when
    it is not there."""
    prefix = distribution.replace("-", "_") + "-"
    for lib in sorted((python.parent.parent / "lib").glob("python*/site-packages")):
        for info in sorted(lib.glob(f"{prefix}*.dist-info")):
            return info.name.removeprefix(prefix).removesuffix(".dist-info")
    return ""


def upright_size(data: bytes) -> tuple[int, int]:
    """(height, width) of the encoded image as the engine sees it: after its EXIF orientation
    (PIL's ``getexif``, as vLLM's ``exif_transpose`` reads it). Decodes no pixels where the
    orientation is known without: always, but for a PNG with metadata after its pixel data.
    ValueError when the bytes are no image PIL opens."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if image.format == "PNG" and _png_opened_whole(data):
                # PIL's PNG getexif decodes the pixels to look for metadata chunks after them
                # (milliseconds a screenshot: docs/benchmarks.md §9); with none there, what it
                # read on opening is all the metadata, and the base method reads just that.
                exif = Image.Image.getexif(image)
            else:
                exif = image.getexif()
            orientation = exif.get(_ORIENTATION_TAG)
    except (OSError, Image.DecompressionBombError, SyntaxError) as exc:
        raise ValueError(f"not an image: {exc}") from exc
    return (width, height) if orientation in _QUARTER_TURNS else (height, width)


def _png_opened_whole(data: bytes) -> bool:
    """Whether every chunk of the PNG ``data`` after its first ``IDAT`` is pixel data or the
    end (so PIL read every metadata chunk on opening). Walks the chunk headers only."""
    at, seen_pixels = 8, False  # past the signature
    while at + 8 <= len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        kind = data[at + 4 : at + 8]
        if kind == b"IEND":
            return True
        if kind == b"IDAT":
            seen_pixels = True
        elif seen_pixels:
            return False
        at += 12 + length  # length, type, data, CRC
    return False  # truncated: let PIL's own reading decide

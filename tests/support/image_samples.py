"""Images for tests, the tests' one source of them: :func:`png` (seeded noise, so pixel values
differ everywhere), :func:`runs` (where the image placeholders of token ids are) and
:func:`reference_inputs` (transformers' own processor, loaded from the tiny VL policy's
preprocessor config, on images opened upright: what a trainer's pixels must equal)."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import transformers
from PIL import Image

from cli.dev.vl_policy import IMAGE_PAD_ID, PREPROCESSOR_CONFIG

_ORIENTATION = 0x0112


def png(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def runs(ids: list[int]) -> list[tuple[int, int]]:
    """(offset, length) of each run of image placeholders in ``ids``."""
    found: list[tuple[int, int]] = []
    for at, token in enumerate(ids):
        if token == IMAGE_PAD_ID:
            if found and sum(found[-1]) == at:
                found[-1] = (found[-1][0], found[-1][1] + 1)
            else:
                found.append((at, 1))
    return found


@cache
def _reference() -> Any:
    """transformers' processor loaded from the VL policy's preprocessor_config.json (its PIL
    class: no torchvision beside the trainer), not built by titoflow."""
    directory = Path(tempfile.mkdtemp(prefix="titoflow-test-processor-"))
    try:
        (directory / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG))
        return transformers.Qwen2VLImageProcessorPil.from_pretrained(directory)
    finally:
        shutil.rmtree(directory)


def reference_inputs(images: list[bytes]) -> dict[str, np.ndarray]:
    """The reference processor's ``pixel_values`` and ``image_grid_thw`` for ``images``, each
    opened upright (the one quarter turn tests use, EXIF orientation 6, undone by hand)."""
    opened = []
    for data in images:
        with Image.open(io.BytesIO(data)) as image:
            turned = image.getexif().get(_ORIENTATION) == 6
            upright = image.transpose(Image.Transpose.ROTATE_270) if turned else image
            opened.append(upright.convert("RGB"))
    return dict(_reference()(images=opened, return_tensors="np"))

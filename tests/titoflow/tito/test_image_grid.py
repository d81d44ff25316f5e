"""An image's run length is known before the engine is called (titoflow/tito/image_grid.py):
the resize is transformers' own, for any size, and the size is the upright one vLLM measures.
The engine's own counts for the same images are checked in
tests/titoflow/engine/test_engine_vl.py."""

from __future__ import annotations

import io
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, ImageOps
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from cli.dev.vl_policy import MAX_PIXELS, MIN_PIXELS, PREPROCESSOR_CONFIG, write_processor
from titoflow.tito.image_grid import ImageProcessing, upright_size

TINY = ImageProcessing(
    patch_size=16,
    merge_size=2,
    min_pixels=MIN_PIXELS,
    max_pixels=MAX_PIXELS,
    image_mean=(0.5, 0.5, 0.5),
    image_std=(0.5, 0.5, 0.5),
)
# Qwen3-VL's own bounds (64x64 pixels .. 16M pixels), the same patches.
QWEN3_VL = ImageProcessing(patch_size=16, merge_size=2, min_pixels=65536, max_pixels=16777216)
sizes = st.tuples(st.integers(1, 8000), st.integers(1, 8000)).filter(
    lambda hw: max(hw) / min(hw) <= 200
)


@given(sizes)
def test_the_resize_is_transformers_smart_resize(size: tuple[int, int]) -> None:
    height, width = size
    for processing in (TINY, QWEN3_VL):
        expected = smart_resize(
            height,
            width,
            factor=processing.patch_size * processing.merge_size,
            min_pixels=processing.min_pixels,
            max_pixels=processing.max_pixels,
        )
        assert processing.resized(height, width) == expected
        t, h, w = processing.grid_thw(height, width)
        assert processing.tokens(height, width) == t * h * w // 4 >= 1


def test_the_tiny_policys_processor_config_is_read(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")
    write_processor(tmp_path)
    assert ImageProcessing.of_model(tmp_path) == TINY
    assert PREPROCESSOR_CONFIG["size"] == {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    assert ImageProcessing.of_model(tmp_path / "absent") is None
    assert TINY.grid_thw(64, 96) == (1, 4, 6) and TINY.tokens(64, 96) == 6
    with pytest.raises(ValueError, match="200 times"):
        TINY.tokens(1, 201)


def encoded(width: int, height: int, fmt: str, orientation: int | None = None) -> bytes:
    image = Image.new("RGB", (width, height), (200, 30, 30))
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(out, format=fmt, exif=exif.tobytes())
    return out.getvalue()


def png_with_late_metadata(width: int, height: int, orientation: int, where: str) -> bytes:
    """A PNG whose orientation is in an eXIf chunk, an XMP text chunk or none, placed before or
    after the pixel data (PIL reads chunks after it only by decoding the image)."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, format="PNG")
    data = out.getvalue()
    exif = Image.Exif()
    exif[0x0112] = orientation
    payload = {
        "exif": (b"eXIf", exif.tobytes()[6:]),
        "xmp": (
            b"iTXt",
            b"XML:com.adobe.xmp\x00\x00\x00\x00\x00"
            + f'<rdf:Description tiff:Orientation="{orientation}"/>'.encode(),
        ),
    }
    kind, body = payload[where.split("-")[0]]
    chunk = len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
    first_pixels = data.index(b"IDAT") - 4
    end = data.index(b"IEND") - 4
    at = first_pixels if where.endswith("before") else end
    return data[:at] + chunk + data[at:]


@given(
    st.integers(1, 64),
    st.integers(1, 64),
    st.integers(1, 8),
    st.sampled_from(["exif-before", "exif-after", "xmp-before", "xmp-after"]),
)
def test_a_png_s_orientation_is_pil_s_wherever_its_metadata_stands(
    width: int, height: int, orientation: int, where: str
) -> None:
    data = png_with_late_metadata(width, height, orientation, where)
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # the engine's reading: every chunk
        upright = ImageOps.exif_transpose(image)
        expected = (upright.height, upright.width)
    assert upright_size(data) == expected


def test_the_size_is_the_upright_one() -> None:
    assert upright_size(encoded(96, 64, "PNG")) == (64, 96)
    assert upright_size(encoded(96, 64, "JPEG", orientation=1)) == (64, 96)
    assert upright_size(encoded(96, 64, "JPEG", orientation=6)) == (96, 64)  # stored sideways
    assert upright_size(encoded(96, 64, "JPEG", orientation=3)) == (64, 96)  # upside down
    with pytest.raises(ValueError, match="not an image"):
        upright_size(b"no image at all")

"""The image contract of vLLM's token API, on the real vLLM CPU engine serving the tiny Qwen3-VL
policy (cli/dev/vl_policy.py): what ``/inference/v1/generate`` does with token ids that
hold image placeholders and images sent beside them as ``content_parts`` (docs/engine.md,
"Images"). The ingress' image path (issue 30, part 2) rests on each of these facts:

- one ``<|image_pad|>`` per image comes back expanded to ``grid_t * grid_h * grid_w / 4`` pads,
  with each image's offset and length, in the reply and in a stream's first event;
- a run already expanded is expanded again (never send the chain's run; send one placeholder);
- placeholder and image counts are not checked against each other (the proxy must count);
- an image is taken by ``uuid`` alone while the engine's cache holds it, refused (400) once it
  does not, and the uuid wins over the bytes (so it must name the bytes: a content hash).

Images are sized in multiples of 32 px within the processor's pixel bounds, so the processor
keeps their size and the expected grid follows from the size alone.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from cli.dev.vl_policy import (
    IMAGE_PAD_ID,
    MERGE,
    PATCH,
    VISION_END_ID,
    VISION_START_ID,
)
from titoflow.engine.api import EngineImage, GenerateParams
from titoflow.engine.vllm import VLLMEngine
from titoflow.errors import EngineError
from titoflow.tito.image_grid import ImageProcessing, upright_size

pytestmark = pytest.mark.engine

IM_START, IM_END, NEWLINE, USER, ASSISTANT, HELLO = 151644, 151645, 198, 872, 77091, 9707
TOKEN_PX = PATCH * MERGE  # one image token covers 32x32 pixels
IMAGE = [VISION_START_ID, IMAGE_PAD_ID, VISION_END_ID]


@pytest.fixture
def vl_engine(vl_engine_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vl_engine_url, timeout=120.0) as client:
        yield client


def test_the_renderer_knows_each_run_length_before_the_call(
    vl_engine: httpx.Client, vl_model_dir: Path
) -> None:
    """Sizes the processor rounds, shrinks to its pixel bound or grows to it, and a JPEG stored
    sideways (EXIF orientation 6). Turning an image a quarter swaps its grid's height and width
    but keeps its run length, so the engine's reply cannot show the orientation was read (the
    grid, recorded per image, is where it matters; tests/titoflow/tito/test_image_grid.py checks
    it)."""
    processing = ImageProcessing.of_model(vl_model_dir)
    assert processing is not None
    images = [encoded(w, h, "PNG") for w, h in ((100, 50), (1000, 37), (37, 2000), (20, 20))]
    images.append(encoded(96, 40, "JPEG", orientation=6))
    ids = prompt(len(images))
    types = ["png"] * 4 + ["jpeg"]
    parts = [
        image_part(f"data:image/{kind};base64," + base64.b64encode(data).decode())
        for kind, data in zip(types, images, strict=True)
    ]

    reply = generate(vl_engine, ids, parts)

    assert reply.status_code == 200, reply.text
    lengths = [run["length"] for run in reply.json()["mm_placeholders"]["image"]]
    assert lengths == [processing.tokens(*upright_size(b)) for b in images] == [6, 31, 62, 1, 3]


def encoded(width: int, height: int, fmt: str, orientation: int | None = None) -> bytes:
    """A flat image in ``fmt``, with that EXIF orientation if any."""
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.new("RGB", (width, height), (30, 90, 200)).save(out, format=fmt, exif=exif.tobytes())
    return out.getvalue()


def png(width: int, height: int, seed: int) -> str:
    """A noise image of that size as a ``data:`` URL."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def prompt(images: int) -> list[int]:
    """A user turn holding ``images`` images (one placeholder each) and a word, then the
    assistant's header, as Qwen3-VL's template renders it."""
    return [IM_START, USER, NEWLINE, *IMAGE * images, HELLO, IM_END, NEWLINE, IM_START, ASSISTANT]


def expanded(ids: list[int], lengths: list[int]) -> list[int]:
    """``ids`` with the i-th single placeholder replaced by ``lengths[i]`` pads."""
    out: list[int] = []
    runs = iter(lengths)
    for token in ids:
        out.extend([IMAGE_PAD_ID] * next(runs) if token == IMAGE_PAD_ID else [token])
    return out


def generate(client: httpx.Client, ids: list[int], parts: list[dict[str, Any]]) -> httpx.Response:
    body = {
        "token_ids": ids,
        "sampling_params": {"max_tokens": 2, "temperature": 0.0, "logprobs": 0},
        "return_token_ids": True,
        "content_parts": parts,
    }
    return client.post("/inference/v1/generate", json=body)


def image_part(url: str | None, uuid: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "url": url}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def test_one_placeholder_per_image_comes_back_expanded(vl_engine: httpx.Client) -> None:
    sizes = [(96, 64), (32, 32), (256, 128)]
    lengths = [(w // TOKEN_PX) * (h // TOKEN_PX) for w, h in sizes]  # 6, 1, 32
    ids = prompt(len(sizes))
    parts = [image_part(png(w, h, seed)) for seed, (w, h) in enumerate(sizes)]

    reply = generate(vl_engine, ids, parts)

    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["prompt_token_ids"] == expanded(ids, lengths)
    offsets = [
        i + 1 for i, token in enumerate(body["prompt_token_ids"]) if token == VISION_START_ID
    ]
    assert body["mm_placeholders"] == {
        "image": [{"offset": o, "length": n} for o, n in zip(offsets, lengths, strict=True)]
    }
    assert len(body["choices"][0]["token_ids"]) == 2

    # Streamed, the first event carries the same expanded ids and placeholders.
    stream_body = {
        "token_ids": ids,
        "sampling_params": {"max_tokens": 2},
        "return_token_ids": True,
        "stream": True,
        "content_parts": parts,
    }
    with vl_engine.stream("POST", "/inference/v1/generate", json=stream_body) as stream:
        events = [
            json.loads(line.removeprefix("data:"))
            for line in stream.iter_lines()
            if line.startswith("data:") and "[DONE]" not in line
        ]
    assert events[0]["prompt_token_ids"] == body["prompt_token_ids"]
    assert events[0]["mm_placeholders"] == body["mm_placeholders"]
    assert all(event.get("prompt_token_ids") is None for event in events[1:])


def test_an_expanded_run_is_expanded_again(vl_engine: httpx.Client) -> None:
    chain = expanded(prompt(1), [6])
    reply = generate(vl_engine, chain, [image_part(png(96, 64, 0))])

    assert reply.status_code == 200, reply.text
    # Its first pad became the image's 6, the other 5 stayed: 6 + 5 pads, not the chain's 6.
    assert reply.json()["prompt_token_ids"].count(IMAGE_PAD_ID) == 11
    assert reply.json()["prompt_token_ids"] != chain


def test_placeholder_and_image_counts_are_not_checked(vl_engine: httpx.Client) -> None:
    two_placeholders_one_image = generate(vl_engine, prompt(2), [image_part(png(96, 64, 0))])
    assert two_placeholders_one_image.status_code == 200
    assert two_placeholders_one_image.json()["prompt_token_ids"] == expanded(prompt(2), [6, 1])

    placeholder_without_image = generate(vl_engine, prompt(1), [])
    assert placeholder_without_image.status_code == 200
    assert placeholder_without_image.json()["prompt_token_ids"] == prompt(1)


def test_an_image_is_taken_by_uuid_while_cached_and_the_uuid_wins(vl_engine: httpx.Client) -> None:
    first, second = png(96, 64, 11), png(96, 64, 12)
    sent = generate(vl_engine, prompt(1), [image_part(first, "first")])
    by_uuid = generate(vl_engine, prompt(1), [image_part(None, "first")])
    assert sent.status_code == by_uuid.status_code == 200, by_uuid.text
    assert by_uuid.json()["prompt_token_ids"] == sent.json()["prompt_token_ids"]
    assert by_uuid.json()["choices"] == sent.json()["choices"]  # greedy: the same image's tokens

    unknown = generate(vl_engine, prompt(1), [image_part(None, "never-sent")])
    assert unknown.status_code == 400
    assert "Cache miss" in unknown.json()["error"]["message"]

    # Other bytes under a cached uuid are answered as the cached image, not as themselves.
    other_bytes = generate(vl_engine, prompt(1), [image_part(second, "first")])
    own_uuid = generate(vl_engine, prompt(1), [image_part(second, "second")])
    assert other_bytes.json()["choices"] == sent.json()["choices"]
    assert own_uuid.json()["choices"] != sent.json()["choices"]


def images_of(chain: list[int], urls: list[str], by_uuid: bool = False) -> tuple[EngineImage, ...]:
    """The chain's image runs (each right after a ``<|vision_start|>``), named by their bytes."""
    starts = [i + 1 for i, token in enumerate(chain) if token == VISION_START_ID]
    out = []
    for start, url in zip(starts, urls, strict=True):
        length = next(i for i in range(start, len(chain)) if chain[i] != IMAGE_PAD_ID) - start
        sha = hashlib.sha256(url.encode()).hexdigest()
        out.append(EngineImage(start, length, sha, url, by_uuid))
    return tuple(out)


async def test_the_client_sends_placeholders_and_takes_only_the_recorded_expansion(
    vl_engine_url: str,
) -> None:
    engine = VLLMEngine(vl_engine_url, timeout_s=120.0)
    urls = [png(96, 64, 21), png(32, 32, 22)]
    chain = expanded(prompt(2), [6, 1])
    params = GenerateParams(max_tokens=3, temperature=0.0, images=images_of(chain, urls))
    try:
        whole = await engine.generate(chain, params, "vl-whole")
        streamed = [c async for c in engine.generate_stream(chain, params, "vl-stream")]
        assert len(whole.token_ids) == 3
        assert [t for c in streamed for t in c.token_ids] == whole.token_ids

        # A chain whose second run is one pad longer than the processor makes it: refused.
        longer = expanded(prompt(2), [6, 2])
        wrong = GenerateParams(max_tokens=1, images=images_of(longer, urls))
        with pytest.raises(EngineError, match="expanded the 2 image"):
            await engine.generate(longer, wrong, "vl-wrong")
        with pytest.raises(EngineError, match="expanded the 2 image"):
            _ = [c async for c in engine.generate_stream(longer, wrong, "vl-wrong-stream")]

        # By uuid alone: an image the engine never cached is resent with its bytes.
        unseen = tuple(
            EngineImage(i.offset, i.length, uuid.uuid4().hex, i.url, by_uuid=True)
            for i in params.images
        )
        by_uuid = dataclasses.replace(params, images=unseen)
        again = await engine.generate(chain, by_uuid, "vl-resent")
        assert again.token_ids == whole.token_ids
    finally:
        await engine.close()

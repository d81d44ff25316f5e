"""What the end-to-end tests read back: topics from the beginning (no consumer group), a
session's recorded steps and segments, the dead letters, and the engine's own answer to a
recorded prompt; and the partition a session's events are published to."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from aiokafka.partitioner import DefaultPartitioner
from pydantic import TypeAdapter

from schemas.events import SegmentFinalized, StepRecorded, steps_topic_adapter
from titoflow.bus import ConsumerRecord, TopicPartition, make_consumer
from titoflow.settings import Settings

T = TypeVar("T")
segment_adapter: TypeAdapter[SegmentFinalized] = TypeAdapter(SegmentFinalized)


async def read_until(
    settings: Settings,
    topic: str,
    adapter: TypeAdapter[T],
    done: Callable[[list[T]], bool],
    timeout_s: float = 60.0,
) -> list[T]:
    """Every event of ``topic`` read so far once ``done(events)`` holds; TimeoutError otherwise."""
    consumer = make_consumer(settings, topic, group_id=None)
    await consumer.start()
    events: list[T] = []
    try:
        async with asyncio.timeout(timeout_s):
            while not done(events):
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    events += [adapter.validate_json(r.value) for r in records]
    finally:
        await consumer.stop()
    return events


async def read_topic(settings: Settings, topic: str) -> list[ConsumerRecord]:
    """Every record of ``topic`` up to its current end, partition by partition, no group."""
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        await consumer.topics()  # metadata, so the partition count is known
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        assert partitions, f"topic {topic} has no partitions"
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        reached = {tp: 0 for tp in partitions}
        records: dict[TopicPartition, list[ConsumerRecord]] = {tp: [] for tp in partitions}
        async with asyncio.timeout(60):
            while any(reached[tp] < end[tp] for tp in partitions):
                batch = await consumer.getmany(timeout_ms=500)
                for tp, partition_records in batch.items():
                    records[tp] += partition_records
                    reached[tp] = partition_records[-1].offset + 1
    finally:
        await consumer.stop()
    return [r for tp in partitions for r in records[tp]]


async def dead_letters(settings: Settings) -> list[ConsumerRecord]:
    return await read_topic(settings, settings.topic("dlq"))


def partition_of(session: str, settings: Settings) -> int:
    """Where the producer's default partitioner puts a session's events."""
    partitions = list(range(settings.steps_partitions))
    partition: int = DefaultPartitioner()(session.encode(), partitions, partitions)
    return partition


async def read_all(
    settings: Settings, topic: str, adapter: TypeAdapter[T], quiet_ms: int = 1500
) -> list[T]:
    """Every event of ``topic``, read until the topic stays quiet for ``quiet_ms``."""
    consumer = make_consumer(settings, topic, group_id=None)
    await consumer.start()
    events: list[T] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=quiet_ms)
            if not batch:
                return events
            for records in batch.values():
                events += [adapter.validate_json(r.value) for r in records]
    finally:
        await consumer.stop()


async def recorded_steps(settings: Settings, session: str, count: int) -> list[StepRecorded]:
    """The first ``count`` steps recorded for ``session``, in log order."""
    events = await read_until(
        settings,
        settings.topic("steps"),
        steps_topic_adapter,
        lambda got: (
            sum(isinstance(e, StepRecorded) and e.session_id == session for e in got) >= count
        ),
    )
    return [e for e in events if isinstance(e, StepRecorded) and e.session_id == session]


async def finalized_segments(
    settings: Settings, ingress_url: str, session: str, timeout_s: float = 120.0
) -> list[SegmentFinalized]:
    """Finalize ``session`` through the ingress and wait for its segments on the topic (all of
    them: its last one comes last)."""
    driver = {"authorization": f"Bearer {settings.driver_token}"} if settings.driver_token else None
    async with httpx.AsyncClient(headers=driver) as http:
        (await http.post(f"{ingress_url}/sess/{session}/finalize", json={})).raise_for_status()
    segments = await read_until(
        settings,
        settings.topic("segments"),
        TypeAdapter(SegmentFinalized),
        lambda got: any(s.session_id == session and s.last_of_session for s in got),
        timeout_s=timeout_s,
    )
    return [s for s in segments if s.session_id == session]


async def sessions_recorded(
    settings: Settings, sessions: list[str], steps: int
) -> tuple[list[StepRecorded], list[SegmentFinalized]]:
    """Once ``steps`` steps are recorded and every one of ``sessions`` has a segment: the steps
    and the segments. Read while the worker runs (stopped, it leaves sessions unassembled)."""
    events = await read_until(
        settings,
        settings.topic("steps"),
        steps_topic_adapter,
        lambda got: sum(isinstance(e, StepRecorded) for e in got) >= steps,
    )
    segments = await read_until(
        settings,
        settings.topic("segments"),
        TypeAdapter(SegmentFinalized),
        lambda got: {s.session_id for s in got} >= set(sessions),
        timeout_s=120,
    )
    return [e for e in events if isinstance(e, StepRecorded)], segments


async def engine_generate(
    engine_url: str, prompt: list[int], seed: int, stop: int, max_tokens: int
) -> Any:
    """The request the ingress makes for a non-streamed turn, sent straight to vLLM."""
    body = {
        "token_ids": prompt,
        "sampling_params": {
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "seed": seed,
            "logprobs": 0,
            "stop_token_ids": [stop],
        },
    }
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{engine_url}/inference/v1/generate", json=body)
    response.raise_for_status()
    return response.json()["choices"][0]


async def engine_prompt_logprobs(engine_url: str, tokens: list[int]) -> list[float | None]:
    """vLLM's prompt logprob of every token of ``tokens`` (None for the first), asked directly
    with the prefix cache bypassed."""
    body = {
        "token_ids": tokens,
        "sampling_params": {
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "skip_reading_prefix_cache": True,
        },
    }
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{engine_url}/inference/v1/generate", json=body)
    response.raise_for_status()
    entries = response.json()["prompt_logprobs"]
    return [
        None if entry is None else entry[str(token)]["logprob"]
        for token, entry in zip(tokens, entries, strict=True)
    ]

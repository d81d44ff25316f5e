"""Session lifecycle on the real stack: header and body forms of the session id, finalize by
header, idle finalize, segments keyed by instance, poison events to the DLQ."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from pydantic import TypeAdapter

from cli.dev.procs import free_port
from cli.dev.stack import start_ingress, start_worker
from schemas.events import DeadLetter, SegmentFinalized
from schemas.reasons import DeadLetterReason
from tests.support.factories import step_segment
from tests.support.topics import read_until
from titoflow.bus import Publisher
from titoflow.client.consumer import SegmentConsumer
from titoflow.settings import Settings

pytestmark = pytest.mark.engine


async def test_header_and_body_sessions_idle_finalize_instance_keys_and_dlq(
    stack_settings: Settings, tmp_path: Path
) -> None:
    worker_metrics = free_port()
    settings = stack_settings.model_copy(
        update={"idle_finalize_s": 3.0, "worker_metrics_port": worker_metrics}
    )
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    by_header, by_body = f"hdr-{uuid.uuid4().hex[:6]}", f"body-{uuid.uuid4().hex[:6]}"
    request: dict[str, Any] = {
        "model": "any-name",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
    }
    publisher = Publisher(settings)
    try:
        # One base URL for everything, the session in headers (as a shared gateway would).
        header_client = AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="unused",
            max_retries=0,
            default_headers={"X-Session-Id": by_header, "X-Instance-Id": "prompt-7"},
        )
        await header_client.chat.completions.create(**request)
        await header_client.close()
        async with httpx.AsyncClient() as http:
            finalized = await http.post(f"{url}/finalize", headers={"X-Session-Id": by_header})
            assert finalized.json() == {"session_id": by_header, "finalized": True}
            # Body fallbacks (extra_body in the SDK); never finalized: the idle timeout closes it.
            body_form = {**request, "session_id": by_body, "instance_id": "prompt-7"}
            answer = await http.post(f"{url}/v1/chat/completions", json=body_form)
            assert answer.status_code == 200
            missing = await http.post(f"{url}/v1/chat/completions", json=request)
        await publisher.publish(settings.topic("steps"), "poison", b"\xff not an event")

        segments = await read_until(
            settings,
            settings.topic("segments"),
            TypeAdapter(SegmentFinalized),
            lambda got: {s.session_id for s in got} >= {by_header, by_body},
        )
        letters = await read_until(
            settings, settings.topic("dlq"), TypeAdapter(DeadLetter), lambda got: bool(got)
        )
        async with httpx.AsyncClient() as http:
            ingress_metrics = (await http.get(f"{url}/metrics")).text
            worker_metrics_text = (
                await http.get(f"http://127.0.0.1:{worker_metrics}/metrics")
            ).text
    finally:
        await publisher.stop()
        ingress.stop()
        worker.stop()

    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "session_id"
    reasons = {s.session_id: s.finalize_reason for s in segments}
    assert reasons == {by_header: "finalized", by_body: "idle"}
    assert {s.instance_id for s in segments} == {"prompt-7"}
    assert len(segments) == 2
    [letter] = letters
    assert letter.key == "poison" and letter.reason is DeadLetterReason.UNDECODABLE_EVENT
    for line in (
        'titoflow_ingress_steps_total{api="openai.chat",prefix="rendered"} 2.0',
        "titoflow_ingress_turn_seconds_count",
        "titoflow_ingress_overhead_seconds_count",
        "titoflow_ingress_publish_seconds_count",
        'titoflow_ingress_tokens_total{direction="completion"}',
    ):
        assert line in ingress_metrics, line
    for line in (
        'titoflow_worker_segments_total{reason="finalized"} 1.0',
        'titoflow_worker_segments_total{reason="idle"} 1.0',
        'titoflow_worker_dead_letters_total{reason="undecodable_event"} 1.0',
        "titoflow_worker_consumer_lag{",
        "titoflow_worker_publish_seconds_count",
    ):
        assert line in worker_metrics_text, line


async def test_segments_of_one_instance_share_a_partition_and_repeats_are_dropped(
    settings: Settings,
) -> None:
    def segment(session: str) -> SegmentFinalized:
        return step_segment(session, ([1], [2], [-0.5]), session_id=session, instance_id="prompt-1")

    publisher = Publisher(settings)
    partitions = set()
    try:
        for session in ("a", "b", "a", "c", "b", "d"):  # a and b twice, as after a worker replay
            placed = await publisher.publish(
                settings.topic("segments"),
                "prompt-1",
                segment(session).model_dump_json().encode(),
            )
            partitions.add(placed[0])
    finally:
        await publisher.stop()
    received = []
    async with SegmentConsumer(settings) as consumer:
        async for item in consumer:
            received.append(item.session_id)
            if item.session_id == "d":
                break
        assert consumer.duplicates_dropped == 2
    assert received == ["a", "b", "c", "d"] and len(partitions) == 1

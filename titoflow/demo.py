"""A short scripted conversation through a running stack, with the official ``openai`` SDK:
three turns (each echoing the assistant's earlier replies, as scaffolds do), a finalize, and the
segment read back from the segments topic."""

from __future__ import annotations

import asyncio
import uuid

import httpx
from openai import AsyncOpenAI

from schemas.events import SegmentFinalized
from titoflow.settings import Settings
from workers.consumer import SegmentConsumer

QUESTIONS = ("What does titoflow record?", "Why exact tokens?", "Thanks, that is all.")


async def converse(
    ingress_url: str, session_id: str, max_tokens: int = 24, driver_token: str = ""
) -> list[str]:
    """Runs the three turns and finalizes the session (as its driver, with ``driver_token``);
    returns the assistant replies."""
    client = AsyncOpenAI(base_url=f"{ingress_url}/sess/{session_id}/v1", api_key="local")
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a terse assistant."}]
    replies = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        response = await client.chat.completions.create(
            model="titoflow-policy",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
        )
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        replies.append(reply)
    await client.close()
    driver = {"authorization": f"Bearer {driver_token}"} if driver_token else None
    async with httpx.AsyncClient(headers=driver) as http:
        (await http.post(f"{ingress_url}/sess/{session_id}/finalize", json={})).raise_for_status()
    return replies


async def wait_for_segment(
    settings: Settings, session_id: str, timeout_s: float = 60.0
) -> tuple[SegmentFinalized, tuple[str, int, int]]:
    """Reads the segments topic (no group, no commits) until a segment of this session arrives;
    returns it with its (topic, partition, offset)."""
    async with SegmentConsumer(settings) as consumer, asyncio.timeout(timeout_s):
        async for segment in consumer:
            if segment.session_id == session_id:
                return segment, consumer.position
    raise AssertionError("the segment consumer stopped")


async def run_demo(settings: Settings, ingress_url: str) -> None:
    session_id = f"demo-{uuid.uuid4().hex[:8]}"
    print(f"\ndemo: 3 turns in session {session_id} through {ingress_url}/sess/{session_id}/v1")
    replies = await converse(ingress_url, session_id, driver_token=settings.driver_token)
    for index, reply in enumerate(replies, start=1):
        print(f"  turn {index}: {reply[:60]!r}")
    segment, (topic, partition, offset) = await wait_for_segment(settings, session_id)
    print(
        f"segment {segment.segment_id} went to topic {topic}, partition {partition}, offset "
        f"{offset}: {len(segment.token_ids)} tokens ({sum(segment.loss_mask)} generated) "
        f"in {len(segment.steps)} steps"
    )

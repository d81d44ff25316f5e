"""The rollouts the trainer tests (OpenRLHF, verl, Tinker) train on: agent sessions through a
real stack (openai SDK → ingress → vLLM CPU, the random tiny Qwen3 whose logprobs are far from
0), two prompts with two rollouts each, opened interleaved (a, b, a, b) so that a trainer's
grouping by position would mix them, sampled at temperature 1 with no cut (the logprobs every
trainer's forward computes), finalized with rewards distinct within each group.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from schemas.events import SegmentFinalized
from titoflow.client.rollout import RolloutClient
from titoflow.dev.stack import start_ingress, start_worker
from titoflow.settings import Settings

PROMPTS = ["Tell me about /tmp.", "What is in /etc?"]
REWARDS = [0.0, 0.25, 1.0, 0.5]  # per session, in open order: distinct within each group


async def agent(base_url: str, prompt: str) -> None:
    """Two turns, the second after a user turn (context in the sample, loss mask 0)."""
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": prompt}]
    for turn in range(2):
        answer = await client.chat.completions.create(
            model="policy", messages=messages, max_tokens=12
        )
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        messages.append({"role": "user", "content": f"and then? ({turn})"})
    await client.close()


async def rollout_sessions(
    stack_settings: Settings, model_dir: Path, tmp_path: Path
) -> list[list[SegmentFinalized]]:
    """Each session's segments, in open order, from an ingress and worker started (and stopped)
    here on the stack's broker and engine, serving ``model_dir``."""
    settings = stack_settings.model_copy(
        update={"driver_token": secrets.token_urlsafe(32), "model_path": model_dir}
    )
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    prompts = PROMPTS * 2
    try:
        async with RolloutClient(url, settings) as driver:
            opened = [
                await driver.open(instance_id=p, sampling={"temperature": 1.0, "top_p": 1.0})
                for p in prompts
            ]
            await asyncio.gather(
                *(agent(o.openai_base_url, p) for o, p in zip(opened, prompts, strict=True))
            )
            for o, reward in zip(opened, REWARDS, strict=True):
                await driver.finalize(o.session_id, reward=reward)
            return [await driver.segments(o.session_id, timeout_s=120) for o in opened]
    finally:
        ingress.stop()
        worker.stop()

"""The rollouts the trainer tests (OpenRLHF, verl, Tinker) train on: agent sessions through a
real stack (openai SDK → ingress → vLLM CPU, the random tiny Qwen3 whose logprobs are far from
0), two prompts with two rollouts each, opened interleaved (a, b, a, b) so that a trainer's
grouping by position would mix them, sampled at temperature 1 with no cut (the logprobs every
trainer's forward computes; at another temperature, on an engine recording processed logprobs),
finalized with rewards distinct within each group; and the way each trainer's step runs in its
own environment (:func:`trainer_step`).
"""

from __future__ import annotations

import asyncio
import json
import pickle
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from cli.dev.stack import start_ingress, start_worker
from schemas.events import SegmentFinalized
from titoflow.client.rollout import RolloutClient
from titoflow.settings import PROJECT_ROOT, Settings

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
    stack_settings: Settings, model_dir: Path, tmp_path: Path, temperature: float = 1.0
) -> list[list[SegmentFinalized]]:
    """Each session's segments, in open order, sampled at ``temperature``, from an ingress and
    worker started (and stopped) here on the stack's broker and engine, serving ``model_dir``."""
    settings = stack_settings.model_copy(
        update={"driver_token": secrets.token_urlsafe(32), "model_path": model_dir}
    )
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    prompts = PROMPTS * 2
    try:
        async with RolloutClient(url, settings) as driver:
            opened = [
                await driver.open(
                    instance_id=p, sampling={"temperature": temperature, "top_p": 1.0}
                )
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


def trainer_step(venv: str, module: str, given: dict[str, Any], tmp_path: Path) -> Any:
    """What ``tests.support.<module>``, run by ``<venv>/bin/python`` (a trainer's own
    environment) from the project root, computed from ``given`` (handed over pickled; it answers
    in JSON). Its stderr is echoed."""
    source, target = tmp_path / f"{module}.pkl", tmp_path / f"{module}.json"
    source.write_bytes(pickle.dumps(given))
    python = PROJECT_ROOT / venv / "bin" / "python"
    step = [str(python), "-m", f"tests.support.{module}", str(source), str(target)]
    run = subprocess.run(step, capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT)
    sys.stderr.write(run.stderr[-4000:])
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(target.read_text())

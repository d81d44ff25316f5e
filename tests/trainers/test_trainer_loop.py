"""The trainer's torch side on the tiny model's real segments (vLLM CPU, tansu, ingress and
worker processes): two prompts, two rollouts each on weights ``v1``, their driver saying the
group size in the sessions' metadata. Read from the topic by ``SegmentDataset`` over a
``TopicSource``, each group is one item whose packed rows, fed to the real tiny policy with
``block_causal_mask``, give back the engine's recorded logprobs; the replay's JSONL of the same
steps then drives docs/trainer.md's training loop, run as written, through one optimizer step
per group."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import AsyncOpenAI
from transformers import AutoModelForCausalLM

from cli.dev.stack import start_ingress, start_worker
from schemas.events import SegmentFinalized
from tests.support.apps import ADMIN_TOKEN, admin
from tests.support.doc_blocks import blocks_run_by
from tests.support.packed_items import check_item_holds
from titoflow.client.rollout import OpenedSession, RolloutClient
from titoflow.client.topic_source import TopicSource
from titoflow.client.torch_data import SegmentDataset, block_causal_mask
from titoflow.settings import Settings
from workers.replay.options import ReplayOptions
from workers.replay.sinks import replay_to

pytestmark = pytest.mark.engine

PAD = 151643
REWARDS = [1.0, 0.0, 0.25, 0.75]  # prompt a's two rollouts, then prompt b's
# vLLM CPU and transformers both compute the float32 model in float32; their kernels differ in
# summation order only. Measured: at most 4e-6 apart here.
LOGPROB_TOLERANCE = 1e-3


async def rollout(opened: OpenedSession, seed: int) -> None:
    """Two chat turns (the second continues the first: one segment of two steps)."""
    client = AsyncOpenAI(base_url=opened.openai_base_url, api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Count to three."}]
    try:
        for turn in range(2):
            response = await client.chat.completions.create(
                model="policy", messages=messages, max_tokens=6, seed=seed + turn
            )
            messages.append(response.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": "Again."})
    finally:
        await client.close()


def groups_from_topic(settings: Settings, count: int) -> list[dict[str, Any]]:
    """The first ``count`` items of a grouped, packed dataset over the topic (then it stops)."""
    dataset = SegmentDataset(
        TopicSource(settings, group_id=None, poll_s=0.2),
        pad_id=PAD,
        pack_tokens=4096,
        group_by_instance=True,
        timeout_s=120,
    )
    items = []
    for item in dataset:
        items.append(item)
        if len(items) == count:
            break
    return items


async def test_grouped_tensors_of_real_segments_and_the_doc_training_loop(
    stack_settings: Settings, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = stack_settings.model_copy(update={"admin_token": ADMIN_TOKEN})
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    run = uuid.uuid4().hex[:6]
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            await admin(http, url, type="set_weight_version", version="v1")
        async with RolloutClient(url, settings) as rollouts:
            opened = [
                await rollouts.open(instance_id=f"{prompt}-{run}", metadata={"group_size": 2})
                for prompt in ("a", "a", "b", "b")
            ]
            await asyncio.gather(*(rollout(o, 10 * i) for i, o in enumerate(opened)))
            for o, reward in zip(opened, REWARDS, strict=True):
                await rollouts.finalize(o.session_id, reward=reward)
            per_session = await asyncio.gather(
                *(rollouts.segments(o.session_id, timeout_s=120) for o in opened)
            )
    finally:
        ingress.stop()
        worker.stop()
    segments: dict[str, SegmentFinalized] = {
        s.segment_id: s for found in per_session for s in found
    }
    assert len(segments) == 4 and all(len(s.steps) == 2 for s in segments.values())
    reward_of = {
        s.segment_id: r for found, r in zip(per_session, REWARDS, strict=True) for s in found
    }

    # From the topic: one item per prompt, complete, holding its two rollouts bit for bit.
    items = await asyncio.to_thread(groups_from_topic, settings, 2)
    assert sorted(item["group"] for item in items) == [f"a-{run}", f"b-{run}"]
    policy: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy.eval()
    worst = 0.0
    for item in items:
        held = [segments[sid] for sid in item["segment_ids"]]
        check_item_holds(item, held)
        assert item["complete"] and item["input_ids"].shape[0] == 1  # both packed in one row
        assert item["reward"].tolist() == [reward_of[sid] for sid in item["segment_ids"]]
        generated = item["loss_mask"] == 1
        assert (item["weight_version"][generated] == 1).all()
        # The real policy on the packed row, each segment attending to itself only: the
        # engine's logprobs of every generated token.
        with torch.no_grad():
            logits = policy(
                input_ids=item["input_ids"],
                position_ids=item["position_ids"],
                attention_mask=block_causal_mask(item["sequence_ids"]),
            ).logits
        new = torch.log_softmax(logits[:, :-1], -1).gather(-1, item["input_ids"][:, 1:, None])
        gap = (new.squeeze(-1) - item["old_logprobs"][:, 1:])[generated[:, 1:]].abs().max()
        worst = max(worst, float(gap))
    print(f"largest gap between the engine's and transformers' logprobs: {worst:.2e}")
    assert worst < LOGPROB_TOLERANCE, worst

    # The replay's JSONL of the same steps (byte-identical segments) drives the doc's loop.
    with (tmp_path / "segments.jsonl").open("wb") as out:
        await replay_to(settings, ReplayOptions(), out=out)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    [loop] = blocks_run_by("tests/trainers/test_trainer_loop.py")
    exec(compile(loop, "docs/trainer.md", "exec"), namespace)
    last = namespace["group"]
    [same] = [item for item in items if item["group"] == last["group"]]
    # The same segments (the replay may finish a group's sessions in another order).
    assert last["complete"] and sorted(last["segment_ids"]) == sorted(same["segment_ids"])
    # Every generated token is of v1, so every one is in the loss; the step moved the model.
    assert namespace["mask"].sum() == last["loss_mask"].sum() > 0
    assert torch.isfinite(namespace["loss"])
    assert namespace["model"].head.weight.grad.abs().sum() > 0
    assert len(namespace["optimizer"].state) > 0

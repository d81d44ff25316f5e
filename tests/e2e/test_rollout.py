"""The rollout side on the real stack (vLLM CPU, tansu, ingress and worker processes): a group
rollout driven by ``RolloutClient`` through the openai SDK, ending in a padded batch, its
sampling forced at open and every step's record equal to what the engine was sent (the witness);
a discarded session; and white-box ``/generate`` calls mixed with a chat call in one session,
assembled into one segment whose tokens, masks and logprobs are the engine's."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI

from cli.dev.stack import start_ingress, start_worker
from schemas.reasons import DiscardReason
from tests.support.families import path_tool
from tests.support.topics import engine_generate, recorded_steps
from tests.support.witness import Witness
from titoflow.client.batch import group_by_instance, pad_segments
from titoflow.client.rollout import OpenedSession, RolloutClient
from titoflow.settings import Settings
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

pytestmark = pytest.mark.engine

TOOLS: Any = [path_tool("ls", "list a directory")]
QWEN3_PAD_ID = 151643
# What the driver forces on the group's sessions, over the agent's temperature 0.7 and top_p 0.9:
# temperature 1 with no cut. The agent's seeds stand (the tokens, and so the test's segments, are
# those of the seeds it picked; per-step seeds: tests/ingress/turns/test_sampling_record.py).
OVERRIDES = {"temperature": 1.0, "top_p": 1.0}


async def run_agent(opened: OpenedSession, seed: int) -> tuple[int, int]:
    """A small tool loop through the openai SDK: two forced ``ls`` calls whose results go
    back as tool messages, then a free answer. Returns (tool calls made, tokens generated)."""
    client = AsyncOpenAI(base_url=opened.openai_base_url, api_key="unused", max_retries=0)
    messages: list[Any] = [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": "What is in /tmp?"},
    ]
    calls = generated = 0
    try:
        for turn in range(3):
            response = await client.chat.completions.create(
                model="policy",
                messages=messages,
                tools=TOOLS,
                tool_choice="required" if turn < 2 else "none",
                max_tokens=48 if turn < 2 else 12,
                seed=seed + turn,
                temperature=0.7,
                top_p=0.9,
            )
            assert response.usage is not None
            generated += response.usage.completion_tokens
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                calls += 1
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.txt"})
    finally:
        await client.close()
    return calls, generated


async def test_group_rollout_with_rewards_becomes_a_padded_batch(
    stack_settings: Settings, tmp_path: Path, witness: Witness
) -> None:
    ingress, url = start_ingress(stack_settings, tmp_path)
    worker = start_worker(stack_settings, tmp_path)
    instance = f"prompt-{uuid.uuid4().hex[:6]}"
    try:
        async with RolloutClient(url, stack_settings) as rollouts:
            group = [
                await rollouts.open(
                    instance_id=instance,
                    channel="train",
                    metadata={"data_source": "unit"},
                    sampling=OVERRIDES,
                )
                for _ in range(3)
            ]
            dropped = await rollouts.open(instance_id=instance, channel="train")
            results = await asyncio.gather(
                *(run_agent(opened, 100 * i) for i, opened in enumerate([*group, dropped]))
            )
            rewards: list[Any] = [1.0, 0.0, {"correct": 1.0, "format": 0.5}]
            for opened, reward in zip(group, rewards, strict=True):
                await rollouts.finalize(opened.session_id, reward=reward, metadata={"judge": "x"})
            await rollouts.discard(dropped.session_id, metadata={"why": "sandbox died"})
            per_session = await asyncio.gather(
                *(rollouts.segments(o.session_id, timeout_s=120) for o in [*group, dropped])
            )
            notice = rollouts.notice(dropped.session_id)
    finally:
        ingress.stop()
        worker.stop()

    # Each session of the group is one segment carrying its instance, channel, metadata and
    # reward; the discarded one yields none, and a notice saying so.
    *kept, discarded = per_session
    assert discarded == [] and notice is not None
    assert (notice.reason, notice.instance_id, notice.metadata) == (
        DiscardReason.DISCARDED,
        instance,
        {"why": "sandbox died"},
    )
    segments = [segment for [segment] in kept]
    assert [s.session_id for s in segments] == [o.session_id for o in group]
    for segment, reward, opened in zip(segments, rewards, group, strict=True):
        assert segment.instance_id == instance and segment.channel == "train"
        assert segment.metadata == {"data_source": "unit", "judge": "x"}
        if isinstance(reward, dict):
            assert segment.reward is None and segment.reward_components == reward
        else:
            assert segment.reward == reward and segment.reward_components == {}
        assert segment.last_of_session and segment.rollout_id == opened.session_id
        assert len(segment.steps) == 3

    # Each step records what the engine was sent (the witness's copy of the request), the
    # driver's sampling over the agent's, and what the agent asked.
    sent_for = {(c.prompt, tuple(c.completion)): c.sampling_params for c in witness.witnessed()}
    for group_index, segment in enumerate(segments):
        for turn, step in enumerate(segment.steps):
            ids = segment.token_ids
            prompt = tuple(ids[: step.completion_start])
            sent = sent_for[prompt, tuple(ids[step.completion_start : step.completion_end])]
            used, asked = step.sampling, step.sampling_asked
            assert used is not None and asked is not None
            assert (used.temperature, used.top_p) == (sent["temperature"], sent["top_p"]) == (1, 1)
            assert used.seed == sent["seed"] == asked.seed == 100 * group_index + turn
            assert used.max_tokens == sent["max_tokens"] == (48 if turn < 2 else 12)
            assert used.stop_token_ids == sent["stop_token_ids"]
            assert (used.top_k, used.stop) == (sent.get("top_k", -1), sent.get("stop", []))
            assert used.constrained == ("structured_outputs" in sent) == (turn < 2)
            # What the stack records and the shared engine was started with: the default.
            assert used.logprobs_mode == stack_settings.engine_logprobs_mode
            assert used.logprobs_mode == "processed_logprobs"
            assert (asked.temperature, asked.top_p) == (0.7, 0.9)
            assert asked.max_tokens == used.max_tokens

    # The batch a trainer builds: one row per rollout, loss on exactly the generated tokens.
    [(key, ordered)] = group_by_instance(segments).items()
    batch = pad_segments(ordered, pad_id=QWEN3_PAD_ID, pad_to_multiple_of=8)
    assert key == instance and batch["input_ids"].shape[0] == 3
    assert batch["input_ids"].shape[1] % 8 == 0
    for row, (segment, (calls, generated)) in enumerate(zip(ordered, results, strict=False)):
        assert calls == 2
        assert int(batch["loss_mask"][row].sum()) == generated
        n = len(segment.token_ids)
        assert batch["input_ids"][row, :n].tolist() == segment.token_ids
        assert np.all(batch["input_ids"][row, n:] == QWEN3_PAD_ID)
        assert int(batch["attention_mask"][row].sum()) == n


async def test_white_box_generate_and_chat_calls_make_one_consistent_segment(
    stack_settings: Settings, tmp_path: Path
) -> None:
    ingress, url = start_ingress(stack_settings, tmp_path)
    worker = start_worker(stack_settings, tmp_path)
    tokenizer = load_tokenizer(stack_settings.model_path)
    stop = ChatRenderer(tokenizer).terminator_id
    sampling = {"max_tokens": 12, "temperature": 1.0, "top_p": 1.0, "stop_token_ids": [stop]}
    answers: list[dict[str, Any]] = []
    try:
        async with RolloutClient(url, stack_settings) as rollouts:
            opened = await rollouts.open(instance_id="white-box")
            chat = AsyncOpenAI(base_url=opened.openai_base_url, api_key="unused", max_retries=0)
            await chat.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "Count to three."}],
                max_tokens=12,
                seed=1,
            )
            await chat.close()
            # The agent owns its tokenization from here: it takes the chat turn's exact tokens,
            # appends its own, and continues through the token API.
            [first] = await recorded_steps(stack_settings, opened.session_id, 1)
            prompt = [*first.prompt_tail_ids, *first.completion_ids]
            async with httpx.AsyncClient(timeout=120) as http:
                for seed, text in [(2, "\nagent note: go on"), (3, "\nagent note: finish")]:
                    prompt += tokenizer.encode(text, add_special_tokens=False)
                    body = {"input_ids": prompt, "sampling_params": {**sampling, "seed": seed}}
                    answer = await http.post(opened.generate_url, json=body)
                    assert answer.status_code == 200, answer.text
                    answers.append({"prompt": list(prompt), "seed": seed, **answer.json()})
                    prompt += answer.json()["token_ids"]
            await rollouts.finalize(opened.session_id, reward=1.0)
            [segment] = await rollouts.segments(opened.session_id, timeout_s=120)
        steps = await recorded_steps(stack_settings, opened.session_id, 3)
    finally:
        ingress.stop()
        worker.stop()

    assert [s.api for s in steps] == ["openai.chat", "generate", "generate"]
    assert [s.prefix for s in steps] == ["rendered", "tito", "tito"]
    assert [s.parent_step_id for s in steps] == [None, steps[0].step_id, steps[1].step_id]
    assert [a["step_id"] for a in answers] == [s.step_id for s in steps[1:]]
    assert {a["chain_id"] for a in answers} == {steps[0].chain_id}

    # One segment: the tokens are the last prompt plus its completion, i.e. every prompt tail
    # and completion in order; the loss mask covers exactly the three completions.
    assert segment.token_ids == prompt
    assert [s.step_id for s in segment.steps] == [s.step_id for s in steps]
    completions = [(s.completion_start, s.completion_end) for s in segment.steps]
    expected_mask = [0] * len(prompt)
    for start, end in completions:
        expected_mask[start:end] = [1] * (end - start)
    assert segment.loss_mask == expected_mask
    assert [segment.token_ids[a:b] for a, b in completions] == [s.completion_ids for s in steps]

    # The logprobs are the engine's own for those prompts (asked directly, same seeds).
    for sent in answers:
        direct = await engine_generate(
            stack_settings.engine_url, sent["prompt"], sent["seed"], stop, 12
        )
        assert sent["token_ids"] == direct["token_ids"]
        assert sent["logprobs"] == [e["logprob"] for e in direct["logprobs"]["content"]]
    generated = [i for i, m in enumerate(segment.loss_mask) if m]
    assert [segment.logprobs[i] for i in generated] == [
        lp for s in steps for lp in s.completion_logprobs
    ]
    assert all(segment.logprob_source[i] == 1 for i in generated)
    assert segment.reward == 1.0

"""End to end on real parts: openai SDK → ingress → real vLLM (CPU) → tansu → worker → segment.

Invariants exercised: exact tokens (the segment's generated ids and logprobs are what the engine
produced for those prompts), TITO (turns 2 and 3 reuse the tokens already sent), durability
(a worker killed and restarted between turns loses nothing; a broker that is down yields a
retryable 503 in OpenAI's error shape, not a 200).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from openai import APIStatusError, AsyncOpenAI

from cli.dev.broker import start_tansu
from cli.dev.procs import ManagedProcess
from cli.dev.stack import start_ingress, start_worker
from tests.support.topics import engine_generate, finalized_segments, recorded_steps
from titoflow.bus import ensure_topics
from titoflow.settings import Settings
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.qwen3 import QWEN3
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

pytestmark = pytest.mark.engine

QUESTIONS = ["List the files in /tmp.", "Which one is largest?", "Delete it."]
MAX_TOKENS = 24


async def wait_for_log(proc: ManagedProcess, text: str, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while text not in proc.log_path.read_text(errors="replace"):
            await asyncio.sleep(0.2)


async def test_three_turns_become_one_exact_segment_across_a_worker_restart(
    stack_settings: Settings, tmp_path: Path
) -> None:
    ingress, url = start_ingress(stack_settings, tmp_path)
    first_worker = start_worker(stack_settings, tmp_path, "worker-a")
    second_worker: ManagedProcess | None = None
    session = f"e2e-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a shell agent."}]
    seen_by_client: list[str] = []
    try:
        for index, question in enumerate(QUESTIONS):
            messages.append({"role": "user", "content": question})
            response = await client.chat.completions.create(
                model="titoflow-policy",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=MAX_TOKENS,
                temperature=1.0,
                seed=1000 + index,
            )
            reply = response.choices[0].message.content or ""
            seen_by_client.append(reply)
            messages.append({"role": "assistant", "content": reply})  # echoed, as scaffolds do
            if index == 0:
                # Kill the worker only once it has consumed turn 1; turn 2 then lands with no
                # worker running, and a new worker must rebuild the session from the log.
                await wait_for_log(first_worker, response.id.removeprefix("chatcmpl-"))
                first_worker.kill()
            if index == 1:
                second_worker = start_worker(stack_settings, tmp_path, "worker-b")
        segments = await finalized_segments(stack_settings, url, session)
    finally:
        await client.close()
        for proc in (ingress, first_worker, second_worker):
            if proc is not None:
                proc.stop()

    steps = await recorded_steps(stack_settings, session, 3)
    [segment] = [s for s in segments if s.session_id == session]
    tokenizer = load_tokenizer(stack_settings.model_path)
    renderer = ChatRenderer(tokenizer)

    # One step per call; turns 2 and 3 reused every token already sent (TITO), not a re-render.
    assert [s.prefix for s in steps] == ["rendered", "tito", "tito"]
    assert [s.parent_step_id for s in steps] == [None, steps[0].step_id, steps[1].step_id]
    prompts: list[list[int]] = []
    sent: list[int] = []
    for step in steps:
        assert step.prefix_len == len(sent)
        prompts.append(sent + step.prompt_tail_ids)
        sent = prompts[-1] + step.completion_ids

    # The generated tokens and logprobs are exactly what the engine returns for those prompts.
    for index, (step, prompt) in enumerate(zip(steps, prompts, strict=True)):
        direct = await engine_generate(
            stack_settings.engine_url, prompt, 1000 + index, renderer.terminator_id, MAX_TOKENS
        )
        assert step.completion_ids == direct["token_ids"]
        assert step.completion_logprobs == [e["logprob"] for e in direct["logprobs"]["content"]]
        parser = QWEN3.parser(
            ParserOptions(step.step_id, parse_tools=False)
        )  # no tools were offered
        parser.feed(tokenizer.decode(step.completion_ids, skip_special_tokens=True))
        assert seen_by_client[index] == parser.finish()[1].content

    # The segment is those exact tokens: context masked out, generated tokens with logprobs.
    assert segment.token_ids == sent
    assert segment.split_reason is None and segment.finalize_reason == "finalized"
    assert [s.step_id for s in segment.steps] == [s.step_id for s in steps]
    generated = [i for i, m in enumerate(segment.loss_mask) if m]
    assert [segment.token_ids[i] for i in generated] == [t for s in steps for t in s.completion_ids]
    assert [segment.logprobs[i] for i in generated] == [
        lp for s in steps for lp in s.completion_logprobs
    ]
    assert all(segment.logprob_source[i] == 1 for i in generated)

    # Re-tokenizing the same conversation (what a TITO-less proxy trains on) differs.
    conversation = [Message(role=m["role"], content=m["content"]) for m in messages]
    naive = renderer.full_prompt(conversation[:-1], (), {})
    assert naive != prompts[-1]
    assert any(
        tokenizer.encode(tokenizer.decode(s.completion_ids), add_special_tokens=False)
        != s.completion_ids
        for s in steps
    )


async def test_broker_down_gives_a_retryable_503_in_openai_shape(
    engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    broker, bootstrap = start_tansu(tmp_path)
    settings = Settings(
        bootstrap_servers=bootstrap,
        topic_prefix="down",
        engine_url=engine_url,
        model_path=model_dir,
        publish_timeout_s=3.0,
    )
    await ensure_topics(settings)
    ingress, url = start_ingress(settings, tmp_path)
    client = AsyncOpenAI(base_url=f"{url}/sess/s-down/v1", api_key="unused", max_retries=0)
    request: dict[str, Any] = {
        "model": "titoflow-policy",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    try:
        await client.chat.completions.create(**request)  # the broker is up: 200
        broker.kill()
        with pytest.raises(APIStatusError) as failure:
            await client.chat.completions.create(**request)
    finally:
        await client.close()
        ingress.stop()
        broker.stop()
    assert failure.value.status_code == 503
    assert failure.value.response.headers.get("retry-after")
    body = failure.value.response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == "broker_unavailable"
    assert body["error"]["type"] == "service_unavailable"
    assert body["error"]["message"]

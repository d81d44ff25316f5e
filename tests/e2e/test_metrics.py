"""Every metric operations.md promises is on /metrics after a short run on real processes:
ingress latency and overhead by API, tokens in and out, TITO hits and misses, tool-parse errors,
publish latency and failures, pause state; worker divergences by class, consumer lag and the
recompute requests; the recompute stage's queue and call latency."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from cli.dev.procs import free_port
from cli.dev.stack import start_ingress, start_recompute, start_worker
from tests.support.topics import finalized_segments
from titoflow.settings import Settings

pytestmark = pytest.mark.engine


def sample(text: str, name: str, labels: str = "") -> float:
    """The value of one sample, e.g. ``sample(text, "x_total", 'kind="a"')``; KeyError if absent."""
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    found = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    if found is None:
        raise KeyError(f"{name}{{{labels}}} is not exported")
    return float(found.group(1))


async def test_operations_metrics_are_exported_after_a_short_run(
    stack_settings: Settings, tmp_path: Path
) -> None:
    worker_port, recompute_port = free_port(), free_port()
    settings = stack_settings.model_copy(
        update={
            "divergence_policy": "recompute",
            "worker_metrics_port": worker_port,
            "recompute_metrics_port": recompute_port,
        }
    )
    ingress, url = start_ingress(settings, tmp_path)
    processes = [ingress, start_worker(settings, tmp_path), start_recompute(settings, tmp_path)]
    session = f"metrics-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    try:
        ask: ChatCompletionMessageParam = {"role": "user", "content": "List /tmp."}
        first = await client.chat.completions.create(
            model="policy", messages=[ask], max_tokens=6, seed=1
        )
        reply: ChatCompletionMessageParam = {
            "role": "assistant",
            "content": first.choices[0].message.content or "",
        }
        follow_up: ChatCompletionMessageParam = {"role": "user", "content": "And /var?"}
        second = await client.chat.completions.create(  # extends the chain: a TITO hit
            model="policy", messages=[ask, reply, follow_up], max_tokens=6, seed=1
        )
        reply_2: ChatCompletionMessageParam = {
            "role": "assistant",
            "content": second.choices[0].message.content or "",
        }
        edited: ChatCompletionMessageParam = {"role": "user", "content": "List /home."}
        thanks: ChatCompletionMessageParam = {"role": "user", "content": "Thanks."}
        # History rewritten (every generated turn kept): a cache miss, a divergence, a rebuild.
        await client.chat.completions.create(
            model="policy",
            messages=[edited, reply, follow_up, reply_2, thanks],
            max_tokens=6,
            seed=1,
        )
        segments = await finalized_segments(settings, url, session)
        async with httpx.AsyncClient() as http:
            ingress_text = (await http.get(f"{url}/metrics")).text
            worker_text = (await http.get(f"http://127.0.0.1:{worker_port}/metrics")).text
            recompute_text = (await http.get(f"http://127.0.0.1:{recompute_port}/metrics")).text
    finally:
        await client.close()
        for process in processes:
            process.stop()

    assert [s.split_reason for s in segments] == [None]  # rebuilt, not split
    api = 'api="openai.chat"'
    assert sample(ingress_text, "titoflow_ingress_turn_seconds_count", api) == 3
    assert sample(ingress_text, "titoflow_ingress_overhead_seconds_count", api) == 3
    assert sample(ingress_text, "titoflow_ingress_tokens_total", 'direction="completion"') == 18
    assert sample(ingress_text, "titoflow_ingress_tokens_total", 'direction="prompt"') > 0
    assert sample(ingress_text, "titoflow_ingress_steps_total", api + ',prefix="tito"') == 1
    assert sample(ingress_text, "titoflow_ingress_steps_total", api + ',prefix="rendered"') == 2
    assert sample(ingress_text, "titoflow_ingress_tool_parse_errors_total", api) == 0
    assert sample(ingress_text, "titoflow_ingress_publish_seconds_count") >= 4  # 3 steps, finalize
    assert sample(ingress_text, "titoflow_ingress_publish_failures_total") == 0
    assert sample(ingress_text, "titoflow_ingress_paused") == 0
    assert sample(ingress_text, "titoflow_ingress_held_requests") == 0

    assert sample(worker_text, "titoflow_worker_divergences_total", 'kind="history_rewrite"') == 1
    assert sample(worker_text, "titoflow_worker_divergences_total", 'kind="tool_change"') == 0
    assert re.search(r"^titoflow_worker_consumer_lag\{partition=", worker_text, re.MULTILINE)
    assert sample(worker_text, "titoflow_worker_recompute_requested_total") == 1

    assert sample(recompute_text, "titoflow_recompute_queue") == 0
    assert sample(recompute_text, "titoflow_recompute_seconds_count") == 1

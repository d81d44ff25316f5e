"""The compose topology, proven with processes (no Docker here): two ingress replicas behind the
load balancer's own nginx config (deploy/nginx.conf.template rendered by deploy/lb-entrypoint.sh,
run by Debian's nginx), two workers in one consumer group, one broker, the real vLLM CPU engine.

Sixteen sessions — half named by the /sess/<id>/ path, half by the X-Session-Id header, half of
them streamed — take three turns each through the load balancer. Invariants checked: sticky
routing (every request of a session reached one replica, so turns 2 and 3 are TITO hits, and both
replicas served sessions), exact tokens (each segment is its steps' prompt tails and completions,
chained, with the engine's logprobs; spot-checked against the engine directly), and exactly one
segment per session after dedupe. A control session sent to one replica and then the other shows
what a miss looks like (a rendered prefix), so the TITO assertions cannot pass by accident.

As in compose, each replica serves the driver plane on its own listener and the load balancer's
driver server alone reaches it: sessions are finalized there, and the scaffold-facing server
answers a finalize 404.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from pydantic import TypeAdapter

from cli.dev.procs import ManagedProcess, free_port
from cli.dev.stack import start_ingress, start_worker
from schemas.events import SegmentFinalized, StepRecorded, steps_topic_adapter
from tests.support.load_balancer import nginx_argv, render_lb_config
from tests.support.topics import engine_generate, read_until
from titoflow.settings import Settings
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

pytestmark = pytest.mark.engine

SESSIONS = 16
TURNS = ["List the files in /tmp.", "Which one is largest?", "Delete it."]
MAX_TOKENS = 16
MODEL = "titoflow-policy"


def seed_of(session_index: int, turn: int) -> int:
    return 1000 * (session_index + 1) + turn


async def converse(
    lb_url: str, session: str, index: int, by_header: bool, stream: bool
) -> list[str]:
    """Three turns of one session through the load balancer; returns what the client saw."""
    if by_header:
        client = AsyncOpenAI(
            base_url=f"{lb_url}/v1",
            api_key="unused",
            max_retries=0,
            default_headers={"X-Session-Id": session},
        )
    else:
        client = AsyncOpenAI(
            base_url=f"{lb_url}/sess/{session}/v1", api_key="unused", max_retries=0
        )
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a shell agent."}]
    replies: list[str] = []
    try:
        for turn, question in enumerate(TURNS):
            messages.append({"role": "user", "content": question})
            request: dict[str, Any] = {
                "model": MODEL,
                "messages": messages,
                "max_tokens": MAX_TOKENS,
                "temperature": 1.0,
                "seed": seed_of(index, turn),
            }
            if stream:
                chunks = await client.chat.completions.create(**request, stream=True)
                reply = ""
                async for chunk in chunks:
                    if chunk.choices and chunk.choices[0].delta.content:
                        reply += chunk.choices[0].delta.content
            else:
                response = await client.chat.completions.create(**request)
                reply = response.choices[0].message.content or ""
            replies.append(reply)
            messages.append({"role": "assistant", "content": reply})  # echoed, as scaffolds do
    finally:
        await client.close()
    return replies


async def finalize(http: httpx.AsyncClient, lb_url: str, session: str, by_header: bool) -> None:
    if by_header:
        response = await http.post(f"{lb_url}/finalize", json={}, headers={"X-Session-Id": session})
    else:
        response = await http.post(f"{lb_url}/sess/{session}/finalize", json={})
    response.raise_for_status()


async def wait_for_group_split(workers: list[ManagedProcess], partitions: int) -> None:
    """Until the two workers' latest assignments split the steps partitions between them."""
    # The worker logs "assigned partitions [0, 1, ...]" (text or JSON lines) on every rebalance.
    pattern = re.compile(r"assigned partitions.*?\[([\d, ]*)\]")

    def latest(proc: ManagedProcess) -> set[int]:
        found = pattern.findall(proc.log_path.read_text(errors="replace"))
        return {int(p) for p in found[-1].split(",") if p.strip()} if found else set()

    try:
        async with asyncio.timeout(60):
            while True:
                a, b = (latest(w) for w in workers)
                if a and b and not a & b and a | b == set(range(partitions)):
                    return
                await asyncio.sleep(0.2)
    except TimeoutError:
        tails = "\n".join(f"--- {w.name}\n{w.log_tail(1500)}" for w in workers)
        raise AssertionError(f"the two workers never split the partitions:\n{tails}") from None


def steps_served(metrics_text: str) -> dict[str, float]:
    """``titoflow_ingress_steps_total`` of one replica, by prefix (tito / rendered)."""
    served: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "titoflow_ingress_steps_total":
                served[sample.labels["prefix"]] += sample.value
    return dict(served)


async def test_session_hashing_keeps_every_session_on_one_replica_and_its_segment_exact(
    stack_settings: Settings, tmp_path: Path
) -> None:
    settings = stack_settings.model_copy(update={"log_level": "INFO"})
    procs: list[ManagedProcess] = []
    try:
        driver_ports = [free_port("127.0.0.1") for _ in "ab"]
        ingress_a, url_a = start_ingress(
            settings.model_copy(update={"driver_port": driver_ports[0]}), tmp_path, "ingress-a"
        )
        procs.append(ingress_a)
        ingress_b, url_b = start_ingress(
            settings.model_copy(update={"driver_port": driver_ports[1]}), tmp_path, "ingress-b"
        )
        procs.append(ingress_b)
        upstream = {url_a.removeprefix("http://"): "a", url_b.removeprefix("http://"): "b"}
        driver_a = f"http://127.0.0.1:{driver_ports[0]}"

        lb_port, lb_driver_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        conf = render_lb_config(
            tmp_path / "lb",
            {
                "LB_UPSTREAMS": " ".join(upstream),
                "LB_LISTEN": f"127.0.0.1:{lb_port}",
                "LB_DRIVER_LISTEN": f"127.0.0.1:{lb_driver_port}",
                "LB_DRIVER_UPSTREAMS": " ".join(f"127.0.0.1:{p}" for p in driver_ports),
            },
        )
        lb = ManagedProcess("nginx", nginx_argv(conf), tmp_path / "nginx.log")
        procs.append(lb)
        lb_url = f"http://127.0.0.1:{lb_port}"

        def lb_healthy() -> bool:
            try:
                return httpx.get(f"{lb_url}/lb-health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        lb.wait_until(lb_healthy, 30, "a healthy /lb-health")

        workers = [start_worker(settings, tmp_path, f"worker-{n}") for n in "ab"]
        procs += workers
        await wait_for_group_split(workers, settings.steps_partitions)

        run = uuid.uuid4().hex[:6]
        sessions = [f"topo-{run}-{i:02d}" for i in range(SESSIONS)]
        by_header = {s: i % 2 == 1 for i, s in enumerate(sessions)}
        streamed = {s: i % 4 >= 2 for i, s in enumerate(sessions)}
        replies = await asyncio.gather(
            *(converse(lb_url, s, i, by_header[s], streamed[s]) for i, s in enumerate(sessions))
        )
        assert all(len(r) == len(TURNS) for r in replies)

        # Control: the same conversation on replica a, then on replica b (no load balancer).
        control = f"topo-{run}-control"
        control_reply = ""
        for turn, url in enumerate((url_a, url_b)):
            async with AsyncOpenAI(
                base_url=f"{url}/sess/{control}/v1", api_key="unused", max_retries=0
            ) as client:
                history: list[dict[str, Any]] = [{"role": "user", "content": TURNS[0]}]
                if turn:
                    history += [
                        {"role": "assistant", "content": control_reply},
                        {"role": "user", "content": TURNS[1]},
                    ]
                response = await client.chat.completions.create(
                    model=MODEL,
                    messages=history,  # type: ignore[arg-type]
                    max_tokens=MAX_TOKENS,
                    seed=7 + turn,
                )
                control_reply = response.choices[0].message.content or ""

        async with httpx.AsyncClient(timeout=30) as http:
            refused = await http.post(f"{lb_url}/sess/{sessions[0]}/finalize", json={})
            assert refused.status_code == 404, refused.text
            lb_driver_url = f"http://127.0.0.1:{lb_driver_port}"
            for s in sessions:
                await finalize(http, lb_driver_url, s, by_header[s])
            (await http.post(f"{driver_a}/sess/{control}/finalize", json={})).raise_for_status()
            metrics = {
                name: steps_served((await http.get(f"{url}/metrics")).text)
                for name, url in (("a", url_a), ("b", url_b))
            }

        segments = await read_until(
            settings,
            settings.topic("segments"),
            TypeAdapter(SegmentFinalized),
            lambda got: set(sessions) <= {seg.session_id for seg in got},
            timeout_s=180,
        )
        expected_steps = SESSIONS * len(TURNS) + 2
        events = await read_until(
            settings,
            settings.topic("steps"),
            steps_topic_adapter,
            lambda got: sum(isinstance(e, StepRecorded) for e in got) >= expected_steps,
        )
    finally:
        for proc in reversed(procs):
            proc.stop()

    steps_by_session: dict[str, list[StepRecorded]] = defaultdict(list)
    for event in events:
        if isinstance(event, StepRecorded):
            steps_by_session[event.session_id].append(event)

    # The control shows a miss: the second replica had no cached chain and rendered in full.
    assert [s.prefix for s in steps_by_session[control]] == ["rendered", "rendered"]

    # Sticky routing, seen by the load balancer: one upstream per session, both upstreams used.
    upstream_of: dict[str, set[str]] = defaultdict(set)
    served_by_lb: dict[str, int] = defaultdict(int)
    for line in (tmp_path / "nginx.log").read_text().splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry["uri"].endswith("/chat/completions"):
            assert entry["status"] == 200, entry
            upstream_of[entry["session"]].add(upstream[entry["upstream"]])
            served_by_lb[upstream[entry["upstream"]]] += 1
    assert set(upstream_of) == set(sessions)
    assert all(len(replicas) == 1 for replicas in upstream_of.values()), upstream_of
    assert {r for replicas in upstream_of.values() for r in replicas} == {"a", "b"}

    # ... and by the replicas themselves: each recorded exactly the turns routed to it (plus one
    # control turn each), every routed turn after the first of its session a TITO hit.
    for name in ("a", "b"):
        sessions_here = sum(1 for replicas in upstream_of.values() if replicas == {name})
        assert metrics[name] == {
            "rendered": sessions_here + 1,
            "tito": sessions_here * (len(TURNS) - 1),
        }
        assert served_by_lb[name] == sessions_here * len(TURNS)

    tokenizer = load_tokenizer(settings.model_path)
    stop_id = ChatRenderer(tokenizer).terminator_id
    checked_with_engine = 0
    for index, session in enumerate(sessions):
        steps = steps_by_session[session]
        assert [s.prefix for s in steps] == ["rendered", "tito", "tito"], session
        assert [s.parent_step_id for s in steps] == [None, steps[0].step_id, steps[1].step_id]

        # Exactly one segment after dedupe (a worker replay would repeat the same id).
        mine = [seg for seg in segments if seg.session_id == session]
        assert len({seg.segment_id for seg in mine}) == 1, session
        segment = mine[0]
        assert segment.split_reason is None and segment.finalize_reason == "finalized"
        assert [s.step_id for s in segment.steps] == [s.step_id for s in steps]

        # Exact: the segment is the steps' tokens, chained; generated tokens carry the engine's
        # logprobs, context tokens none.
        prompts: list[list[int]] = []
        sent: list[int] = []
        for step in steps:
            assert step.prefix_len == len(sent)
            prompts.append(sent + step.prompt_tail_ids)
            sent = prompts[-1] + step.completion_ids
        assert segment.token_ids == sent
        generated = [i for i, m in enumerate(segment.loss_mask) if m]
        assert [segment.token_ids[i] for i in generated] == [
            t for s in steps for t in s.completion_ids
        ]
        assert [segment.logprobs[i] for i in generated] == [
            lp for s in steps for lp in s.completion_logprobs
        ]
        assert all(segment.logprob_source[i] == 1 for i in generated)
        assert not any(segment.logprob_source[i] for i in range(len(sent)) if i not in generated)

        # Spot check against the engine itself: one session routed by path, one by header.
        if not streamed[session] and checked_with_engine < 2:
            checked_with_engine += 1
            for turn, (step, prompt) in enumerate(zip(steps, prompts, strict=True)):
                direct = await engine_generate(
                    settings.engine_url, prompt, seed_of(index, turn), stop_id, MAX_TOKENS
                )
                assert step.completion_ids == direct["token_ids"]
                assert step.completion_logprobs == [
                    e["logprob"] for e in direct["logprobs"]["content"]
                ]
    assert checked_with_engine == 2

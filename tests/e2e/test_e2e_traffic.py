"""Seeded randomized agent traffic on the real stack, held to the engine witness.

SDKs (openai chat, anthropic messages, openai responses) → ingress → recording proxy → vLLM CPU
→ tansu → workers. Sessions run concurrently, each a random script of: continue, a retry of the
same request (the client keeps the second answer), a re-sample continued from either answer, a
fork from an earlier turn, sub-agents on the same base URL with the same and with a different
start, an edited history, a changed tool list, streamed and not. Meanwhile two workers share the
steps partitions and, at seeded random moments, the group's membership changes: a worker is
SIGKILLed or leaves gracefully and a replacement starts, or one more joins, each kind at least
once per run (a kind the traffic ended before comes while every session is still open, before
any is finalized); each change moves partitions of open sessions away from their worker and often
back (issue 42). Afterwards every
completion the engine gave a client is trainable in exactly one segment, after exactly the prompt
the engine saw, with the engine's logprobs bit for bit, and the DLQ is empty (no session was
taken for partial). The seed (``TITOFLOW_TRAFFIC_SEED``) reproduces the traffic and the order of
the changes; only the moments they land depend on timing.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from openai import AsyncOpenAI
from pydantic import TypeAdapter

from cli.dev.procs import ManagedProcess
from cli.dev.stack import start_ingress, start_worker
from schemas.events import DeadLetter, SegmentFinalized, StepRecorded, steps_topic_adapter
from tests.support.families import path_tool
from tests.support.topics import read_all, read_until
from tests.support.witness import Witness, check_segments
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

SEED = int(os.environ.get("TITOFLOW_TRAFFIC_SEED", "20261123"))
SESSIONS = 8
MAX_TOKENS = 12
CHAT_TOOLS: Any = [path_tool("ls", "List a directory."), path_tool("cat", "Print a file.")]
API_KINDS = ("chat", "anthropic", "responses")
MEMBERSHIP_CHANGES = ("sigkill", "leave", "join")
MAX_WORKERS = 3


@dataclass
class Thread:
    """One conversation as its client holds it, in its API's own shapes."""

    api: str
    history: list[dict[str, Any]]
    tools_changed: bool = False
    snapshots: list[list[dict[str, Any]]] = field(default_factory=list)


class Client:
    """One session's SDK clients and how each API asks, echoes and follows up."""

    def __init__(self, url: str, session: str, rng: random.Random) -> None:
        self.openai = AsyncOpenAI(
            base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0
        )
        self.anthropic = anthropic.AsyncAnthropic(
            base_url=f"{url}/sess/{session}", api_key="unused", max_retries=0
        )
        self.rng = rng
        self.calls = 0

    async def close(self) -> None:
        await self.openai.close()
        await self.anthropic.close()

    def start(self, api: str, task: str) -> Thread:
        system, user = "You are a shell agent.", f"Task: {task}"
        if api == "chat":
            return Thread(api, [{"role": "system", "content": system}, _user(api, user)])
        if api == "anthropic":
            return Thread(api, [_user(api, user)])
        return Thread(api, [{"role": "developer", "content": system}, _user(api, user)])

    async def ask(self, thread: Thread) -> list[dict[str, Any]]:
        """One call on the thread's history; what the client appends to echo the answer."""
        self.calls += 1
        stream = self.rng.random() < 0.5
        if thread.api == "chat":
            return await self._chat(thread, stream)
        if thread.api == "anthropic":
            return await self._anthropic(thread, stream)
        return await self._responses(thread, stream)

    async def _chat(self, thread: Thread, stream: bool) -> list[dict[str, Any]]:
        tools = CHAT_TOOLS[:1] if thread.tools_changed else CHAT_TOOLS
        request: dict[str, Any] = {
            "model": "policy",
            "messages": thread.history,
            "max_tokens": MAX_TOKENS,
            "temperature": 1.0,
            "tools": tools,
        }
        if self.rng.random() < 0.4:
            request["tool_choice"] = "required"  # the engine's constrained decoding
        if not stream:
            message = (await self.openai.chat.completions.create(**request)).choices[0].message
            calls = [c.model_dump() for c in message.tool_calls or []]
            return [{"role": "assistant", "content": message.content or "", "tool_calls": calls}]
        text, calls = "", []
        async for chunk in await self.openai.chat.completions.create(stream=True, **request):
            if chunk.choices:
                delta = chunk.choices[0].delta
                text += delta.content or ""
                calls += [
                    {"id": c.id, "type": "function", "function": c.function.model_dump()}
                    for c in delta.tool_calls or []
                    if c.function is not None
                ]
        return [{"role": "assistant", "content": text, "tool_calls": calls}]

    async def _anthropic(self, thread: Thread, stream: bool) -> list[dict[str, Any]]:
        request: dict[str, Any] = {
            "model": "policy",
            "system": "You are a shell agent.",
            "messages": thread.history,
            "max_tokens": MAX_TOKENS,
            "extra_body": {"temperature": 1.0},  # this SDK version has no such argument
        }
        if not thread.tools_changed:
            request["tools"] = [
                {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}
            ]
        if stream:
            async with self.anthropic.messages.stream(**request) as events:
                message = await events.get_final_message()
        else:
            message = await self.anthropic.messages.create(**request)
        blocks = [b.model_dump(exclude_none=True) for b in message.content]
        return [{"role": "assistant", "content": blocks or ""}]

    async def _responses(self, thread: Thread, stream: bool) -> list[dict[str, Any]]:
        request: dict[str, Any] = {
            "model": "policy",
            "input": thread.history,
            "max_output_tokens": MAX_TOKENS,
            "temperature": 1.0,
        }
        if not thread.tools_changed:
            request["tools"] = [{"type": "function", "name": "exec", "parameters": {}}]
        if not stream:
            response = await self.openai.responses.create(**request)
            return [item.model_dump(exclude_none=True) for item in response.output]
        final: list[dict[str, Any]] = []
        async for event in await self.openai.responses.create(stream=True, **request):
            # A reply cut at max_output_tokens ends as response.incomplete, not .completed.
            if event.type in ("response.completed", "response.incomplete"):
                final = [item.model_dump(exclude_none=True) for item in event.response.output]
        return final

    def follow_up(self, thread: Thread, answer: list[dict[str, Any]], turn: int) -> None:
        """Append the answer as the client echoes it, then tool results or a new question."""
        thread.history += answer
        results = _tool_results(thread.api, answer, turn)
        thread.history += results or [_user(thread.api, f"Go on, step {turn}.")]


def _user(api: str, text: str) -> dict[str, Any]:
    if api == "responses":
        return {"role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"role": "user", "content": text}


def _tool_results(api: str, answer: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    output = f"file-{turn}.txt"
    if api == "chat":
        calls = answer[0].get("tool_calls") or []
        return [{"role": "tool", "tool_call_id": c["id"], "content": output} for c in calls]
    if api == "anthropic":
        content = answer[0]["content"]
        uses = [b for b in content if isinstance(content, list) and b["type"] == "tool_use"]
        blocks = [{"type": "tool_result", "tool_use_id": b["id"], "content": output} for b in uses]
        return [{"role": "user", "content": blocks}] if blocks else []
    return [
        {"type": "function_call_output", "call_id": item["call_id"], "output": output}
        for item in answer
        if item.get("type") == "function_call"
    ]


async def run_session(client: Client, rng: random.Random, plan: Counter[str]) -> None:
    """A random script of agent behaviour on one session (one base URL)."""
    main = client.start(rng.choice(API_KINDS), "list /tmp")
    threads = [main]
    for turn in range(rng.randint(3, 6)):
        thread = rng.choice(threads)
        op = rng.choice(["continue", "continue", "retry", "resample", "fork", "sub", "rewrite"])
        if op == "fork" and thread.snapshots:
            thread.history = [dict(m) for m in rng.choice(thread.snapshots)]
        elif op == "sub":  # a sub-agent on the same base URL: same start or its own
            same = rng.random() < 0.5
            sub = client.start(
                main.api if same else rng.choice(API_KINDS), "list /tmp" if same else "read notes"
            )
            threads.append(sub)
            thread = sub
        elif op == "rewrite" and len(thread.history) > 2:
            edited = next(i for i, m in enumerate(thread.history) if m.get("role") == "user")
            thread.history[edited] = _user(thread.api, f"Task: list /var ({turn})")
        if rng.random() < 0.15:
            thread.tools_changed = not thread.tools_changed
            plan["tool_change"] += 1
        plan[op] += 1
        thread.snapshots.append([dict(m) for m in thread.history])
        answer = await client.ask(thread)
        if op in ("retry", "resample"):
            again = await client.ask(thread)
            keep_second = op == "retry" or rng.random() < 0.5
            answer = again if keep_second else answer
        client.follow_up(thread, answer, turn)


async def test_randomized_agent_traffic_with_worker_kills_holds_to_the_witness(
    stack_settings: Settings, witness: Witness, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    ingress, url = start_ingress(stack_settings, tmp_path)
    workers: list[ManagedProcess] = [
        start_worker(stack_settings, tmp_path, f"worker-{i}") for i in range(2)
    ]
    sessions = [f"traffic-{SEED}-{i}-{uuid.uuid4().hex[:6]}" for i in range(SESSIONS)]
    clients = [Client(url, s, random.Random(rng.random())) for s in sessions]
    plan: Counter[str] = Counter()
    traffic_done = asyncio.Event()
    changes = random.Random(SEED + 1)

    def change_membership(change: str) -> None:
        """One membership change: the oldest live worker is SIGKILLed or leaves (SIGTERM) and a
        replacement starts, or a worker joins while at most three are alive."""
        alive = [w for w in workers if w.alive()]
        if change == "join" and len(alive) < MAX_WORKERS:
            workers.append(start_worker(stack_settings, tmp_path, f"worker-{len(workers)}"))
            plan["worker_joins"] += 1
            return
        victim = alive[0]
        if change == "leave":
            victim.stop()
            plan["worker_leaves"] += 1
        else:
            victim.kill()
            plan["worker_kills"] += 1
        workers.append(start_worker(stack_settings, tmp_path, f"worker-{len(workers)}"))

    # Each kind of change once, in a seeded order, then seeded draws.
    first = list(MEMBERSHIP_CHANGES)
    changes.shuffle(first)

    async def churn() -> None:
        pause = changes.uniform(1.0, 3.0)
        while not traffic_done.is_set():
            await asyncio.sleep(pause)
            pause = changes.uniform(2.0, 5.0)
            if traffic_done.is_set():
                return
            change = first.pop() if first else changes.choice(MEMBERSHIP_CHANGES)
            await asyncio.to_thread(change_membership, change)

    killer = asyncio.create_task(churn())
    try:
        limit = asyncio.Semaphore(3)

        async def bounded(client: Client) -> None:
            async with limit:
                await run_session(client, random.Random(rng.random()), plan)

        await asyncio.gather(*(bounded(c) for c in clients))
        traffic_done.set()
        await killer
        # Kinds the traffic ended before: now, with every session still open (none finalized).
        while first:
            await asyncio.to_thread(change_membership, first.pop())
            await asyncio.sleep(changes.uniform(1.0, 3.0))
        async with httpx.AsyncClient() as http:
            half = len(sessions) // 2
            for index, session in enumerate(sessions):
                if index == half:  # a kill while segments are being published
                    await asyncio.sleep(rng.uniform(0.0, 1.0))
                    change_membership("sigkill")
                answer = await http.post(f"{url}/sess/{session}/finalize", json={"reward": 1.0})
                answer.raise_for_status()
        records = await read_until(
            stack_settings,
            stack_settings.topic("segments"),
            TypeAdapter(SegmentFinalized),
            lambda got: {s.session_id for s in got if s.last_of_session} >= set(sessions),
            timeout_s=180,
        )
        dead = await read_all(stack_settings, stack_settings.topic("dlq"), TypeAdapter(DeadLetter))
    finally:
        traffic_done.set()
        for client in clients:
            await client.close()
        ingress.stop()
        for worker in workers:
            worker.stop()
    segments = list({s.segment_id: s for s in records}.values())  # restarts re-publish
    steps = [
        e
        for e in await read_all(stack_settings, stack_settings.topic("steps"), steps_topic_adapter)
        if isinstance(e, StepRecorded)
    ]
    calls = witness.witnessed()
    summary = {
        "seed": SEED,
        "sessions": len(sessions),
        "client_calls": sum(c.calls for c in clients),
        "steps": len(steps),
        "witnessed": len(calls),
        "segments": len(segments),
        "segments_published": len(records),
        "unused_samples": sum(s.unused_sample for s in segments),
        "split_reasons": dict(Counter(s.split_reason for s in segments)),
        "dlq": len(dead),
        **plan,
    }
    print(f"traffic summary: {summary}")
    assert all(plan[kind] for kind in ("worker_kills", "worker_leaves", "worker_joins")), plan
    assert dead == [], [d.reason for d in dead]
    assert len(calls) == len(steps) == sum(c.calls for c in clients)
    assert len({s.step_id for s in steps}) == len(steps)
    check_segments(segments, calls, complete=True)

"""Sample identity on the real stack (openai SDK → ingress → recording proxy → vLLM CPU → tansu
→ worker), checked against what the engine witnessed, not against titoflow's own step events.

One session runs the same conversation twice (first non-streamed, then streamed; both start with
the same system + user message), five turns each with tool results and follow-up user messages
between turns, at temperature 1. Along the way the client re-sends a request it already got an
answer to (an SDK retry after a timeout) and continues from the second answer, and asks one prompt
twice (best-of-2) and continues the first, and asks for ``n`` = 4 samples of one prompt in one
request and continues the third. Every completion the client received must reach a segment
exactly once, after exactly the prompt the engine saw; nothing goes to the DLQ.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from pydantic import TypeAdapter

from cli.dev.stack import start_ingress, start_worker
from schemas.events import DeadLetter, StepRecorded
from tests.support.apps import echoed_choices
from tests.support.families import path_tool
from tests.support.sessions import session_on_stack
from tests.support.topics import finalized_segments, read_all, recorded_steps
from tests.support.witness import Witness, check_segments
from titoflow.client.consumer import SegmentConsumer
from titoflow.client.rollout import OpenedSession, RolloutClient
from titoflow.settings import Settings

pytestmark = pytest.mark.engine

TOOLS: Any = [path_tool("ls", "List a directory."), path_tool("cat", "Print a file.")]
START = [
    {"role": "system", "content": "You are a shell agent."},
    {"role": "user", "content": "What is in /tmp?"},
]


N = 4  # the samples of the turn asked with ``n``
CONTINUED = 2  # the choice of those the client goes on with


async def _ask(
    client: AsyncOpenAI, messages: list[dict[str, Any]], turn: int, stream: bool, n: int = 1
) -> list[dict[str, Any]]:
    """One turn; each choice's assistant message as the client echoes it back. Even turns must
    call a tool (the engine's own constrained decoding), odd turns answer freely."""
    tools: dict[str, Any] = {"tools": TOOLS}
    if turn % 2 == 0:
        tools["tool_choice"] = "required"
    common: dict[str, Any] = {
        "model": "policy",
        "messages": messages,
        "max_tokens": 20,
        "temperature": 1.0,
        **tools,
    }
    return (await echoed_choices(client, n, stream, **common))[0]


def _next_input(answer: dict[str, Any], turn: int) -> list[dict[str, Any]]:
    """What the scaffold sends after ``answer``: its tool results, or a follow-up question."""
    if answer["tool_calls"]:
        return [
            {"role": "tool", "tool_call_id": call["id"], "content": f"result {turn}"}
            for call in answer["tool_calls"]
        ]
    return [{"role": "user", "content": f"And then? ({turn})"}]


async def _conversation(
    client: AsyncOpenAI, stream: bool, received: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    messages = [dict(m) for m in START]
    for turn in range(5):
        if turn == 1:  # n samples in one request: the client goes on with one of them
            answers = await _ask(client, messages, turn, stream, n=N)
            received += answers
            answer = answers[CONTINUED]
        else:
            [answer] = await _ask(client, messages, turn, stream)
            received.append(answer)
        if turn == 2:  # the SDK re-sends the same request (a timeout): it keeps the new answer
            [answer] = await _ask(client, messages, turn, stream)
            received.append(answer)
        if turn == 3:  # best-of-2: the same prompt twice, the first one continued
            received += await _ask(client, messages, turn, stream)
        messages += [answer, *_next_input(answer, turn)]
    return messages


async def test_one_session_runs_a_conversation_twice_and_every_sample_reaches_training_once(
    stack_settings: Settings, witness: Witness, tmp_path: Path
) -> None:
    received: list[dict[str, Any]] = []
    async with session_on_stack(stack_settings, tmp_path, "samples") as (url, session, client):
        await _conversation(client, stream=False, received=received)
        await _conversation(client, stream=True, received=received)
        segments = await finalized_segments(stack_settings, url, session)
        dead = await read_all(stack_settings, stack_settings.topic("dlq"), TypeAdapter(DeadLetter))

    steps = await recorded_steps(stack_settings, session, len(received))
    # One step per sample: 2 x (5 + retry + best-of-2 + the other n - 1 samples).
    assert len(steps) == len(received) == 2 * (7 + N - 1)
    assert len({s.step_id for s in steps}) == len(steps), "two samples share a step id"
    tool_ids = [c["id"] for s in steps for c in s.response_message.get("tool_calls", [])]
    assert len(set(tool_ids)) == len(tool_ids), "two samples share a tool-call id"
    assert dead == [], [d.reason for d in dead]
    calls = witness.witnessed()
    assert len(calls) == len(received)
    counts = check_segments(segments, calls, complete=True)
    # The retry's first answer, the unpicked best-of-2 candidate and the n - 1 samples not
    # continued, in each conversation.
    assert [s.unused_sample for s in segments].count(True) == 2 * (2 + N - 1)
    _n_samples_are_siblings(steps)
    assert counts["trainable_steps"] == len(received)
    _both_conversations_in_segments(steps, segments)
    # The trainer's consumer skips the unused samples by default (they come first on the topic).
    used = [s.segment_id for s in segments if not s.unused_sample]
    yielded: list[str] = []
    async with SegmentConsumer(stack_settings) as consumer, asyncio.timeout(60):
        async for segment in consumer:
            yielded.append(segment.segment_id)
            if len(yielded) == len(used):
                break
    assert yielded == used


def _n_samples_are_siblings(steps: list[StepRecorded]) -> None:
    """Each conversation's n samples: one parent, one prompt, one request each (the engine's),
    a step id each; the next turn continues one of them."""
    by_parent: dict[str | None, list[StepRecorded]] = {}
    for step in steps:
        by_parent.setdefault(step.parent_step_id, []).append(step)
    groups = [g for g in by_parent.values() if len(g) == N]
    assert len(groups) == 2, [len(g) for g in by_parent.values()]
    for group in groups:
        assert len({(s.prefix_len, tuple(s.prompt_tail_ids)) for s in group}) == 1
        assert len({s.engine_request_id for s in group}) == N
        assert sum(s.step_id in by_parent for s in group) == 1  # the continued one


def _both_conversations_in_segments(steps: list[StepRecorded], segments: list[Any]) -> None:
    """The two runs' first turns (same prompt, rendered once and sampled again) head two
    branches that both reach the trainer."""
    first_turns = [s for s in steps if s.parent_step_id is None]
    trained = {
        entry.step_id
        for segment in segments
        for entry in segment.steps
        if any(segment.loss_mask[entry.completion_start : entry.completion_end])
    }
    assert len(first_turns) >= 2 and all(s.step_id in trained for s in first_turns)
    assert {s.step_id for s in steps} == trained


SESSION_SAMPLING: list[dict[str, Any]] = [
    {},
    {"seed": 7},  # fixed: a retry samples the same answer again
    {"seed": 11, "seed_policy": "per_step"},
    {"temperature": 1.0, "top_p": 1.0},
]


async def test_a_linear_rollout_with_n_samples_and_retries_is_one_trajectory(
    stack_settings: Settings, witness: Witness, tmp_path: Path
) -> None:
    """Issue 38. Rollouts opened by a driver (with and without sampling overrides, fixed and
    per-step seeds) each run rounds of chat with ``n`` in 1-3, streamed or not, sometimes a
    retry of the round's request, and go on with a random one of the answers, never going
    back: each is one trajectory segment (``split_reason`` none, ``last_of_session``) plus one
    unused-sample segment per answer it did not go on with."""
    rng = random.Random(20261128)
    ingress, url = start_ingress(stack_settings, tmp_path)
    worker = start_worker(stack_settings, tmp_path)
    samples: dict[str, int] = {}  # session → completions it received
    rounds: dict[str, int] = {}
    try:
        async with RolloutClient(url, stack_settings) as rollouts:
            opened = [await rollouts.open(sampling=s) for s in SESSION_SAMPLING]

            async def rollout(session: OpenedSession, plan: random.Random) -> None:
                client = AsyncOpenAI(base_url=session.openai_base_url, api_key="u", max_retries=0)
                messages = [dict(m) for m in START]
                for turn in range(plan.randint(2, 4)):
                    stream, n = plan.random() < 0.5, plan.randint(1, 3)
                    answers = await _ask(client, messages, turn, stream, n=n)
                    if plan.random() < 0.3:  # a retry: the same request again, its answers kept
                        answers = await _ask(client, messages, turn, stream, n=n)
                        samples[session.session_id] = samples.get(session.session_id, 0) + n
                    samples[session.session_id] = samples.get(session.session_id, 0) + n
                    rounds[session.session_id] = turn + 1
                    answer = plan.choice(answers)
                    messages += [answer, *_next_input(answer, turn)]
                await client.close()

            await asyncio.gather(*(rollout(o, random.Random(rng.random())) for o in opened))
            for session in opened:
                await rollouts.finalize(session.session_id, reward=1.0)
            found = [await rollouts.segments(o.session_id, timeout_s=120) for o in opened]
    finally:
        ingress.stop()
        worker.stop()

    calls = witness.witnessed()
    segments = [s for per_session in found for s in per_session]
    assert len(calls) == sum(samples.values())
    check_segments(segments, calls, complete=True)
    report = []
    for session, per_session in zip(opened, found, strict=True):
        trajectories = [s for s in per_session if not s.unused_sample]
        unused = [s for s in per_session if s.unused_sample]
        report.append((len(trajectories), len(unused), samples[session.session_id]))
        assert [(s.split_reason, s.last_of_session) for s in trajectories] == [(None, True)]
        assert len(trajectories[0].steps) == rounds[session.session_id]
        assert len(unused) == samples[session.session_id] - rounds[session.session_id]
    print(f"(trajectories, unused samples, samples) per session: {report}")

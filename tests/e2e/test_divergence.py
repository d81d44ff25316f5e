"""Divergences on the real stack: httpx → two ingress replicas → real vLLM (CPU) → tansu → a
worker with ``divergence_policy: recompute`` → the recompute stage → segments.

Six sessions each take a second turn through a full render: a history rewrite (an edited user
message), the same sampled at temperature 0.7, a Claude-Code-style ``<system-reminder>`` injected
into an earlier user message, a changed tool schema, and two cache misses (the turn goes to a
replica that never saw the session): one whose render repeats the tokens sent (it extends the
segment, ``cache_miss``) and one whose sampled reply re-encodes to other ids (a divergence). Each
is classified; diverged segments are rebuilt on the rendered prompt with the first turn
recomputed (invariant 1: every recomputed logprob equals the engine's own prompt logprob for that
token), and replays of the recorded steps show the same steps under ``split`` and under
``last-step``. The engine records processed logprobs (the default): at temperature 1 they are
the prompt logprobs' own distribution, at 0.7 they are not, so that session's rebuilt turn is
masked (``recompute_masked_processed``), never given a raw value beside processed ones.
"""

from __future__ import annotations

import asyncio
import io
import math
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from cli.dev.procs import free_port
from cli.dev.stack import start_ingress, start_recompute, start_worker
from schemas.events import (
    LOGPROB_SOURCE_NONE,
    LOGPROB_SOURCE_RECOMPUTED,
    LOGPROB_SOURCE_SAMPLED,
    SegmentFinalized,
)
from tests.support.families import path_tool
from tests.support.topics import engine_prompt_logprobs, read_until, recorded_steps
from titoflow.settings import Settings
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer
from workers.rebuild import common_prefix
from workers.replay.driver import replay
from workers.replay.options import ReplayOptions
from workers.replay.sinks import JsonlSink
from workers.worker import assembler_for

pytestmark = pytest.mark.engine

SYSTEM = {"role": "system", "content": "You are a shell agent."}
ASK = {"role": "user", "content": "List the files in /tmp."}
FOLLOW_UP = {"role": "user", "content": "Which one is largest?"}
REMINDER = "<system-reminder>\nThe date is 2026-11-21.\n</system-reminder>\n"
TOOLS = [path_tool("ls", "List a directory.")]
MAX_TOKENS = 12
# scenario → (the class its second turn must get, how the second request differs)
SCENARIOS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "rewrite": ("history_rewrite", {"edit": "List the files in /var."}),
    "rewrite_t07": ("history_rewrite", {"edit": "List the files in /etc.", "temperature": 0.7}),
    "reminder": ("history_rewrite", {"edit": REMINDER + ASK["content"]}),
    "tools": ("tool_change", {"tools": TOOLS}),
    # A cache miss whose rendered prompt repeats the tokens sent (seed 7's reply re-encodes to
    # the ids sampled) extends the segment; one whose reply re-encodes otherwise (seed 2) diverges.
    "miss": ("cache_miss", {"other_replica": True}),
    "miss_diverging": (None, {"other_replica": True, "seed": 2}),
}


async def chat(url: str, session: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    body = {"model": "policy", "messages": messages, "max_tokens": MAX_TOKENS, "seed": 7, **extra}
    async with httpx.AsyncClient(timeout=120) as http:
        answer = await http.post(f"{url}/sess/{session}/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"] or "")


async def run_scenario(urls: tuple[str, str], session: str, change: dict[str, Any]) -> None:
    sampling = {"temperature": change["temperature"]} if "temperature" in change else {}
    reply = await chat(urls[0], session, [SYSTEM, ASK], seed=change.get("seed", 7), **sampling)
    first_user = {**ASK, "content": change.get("edit", ASK["content"])}
    messages = [SYSTEM, first_user, {"role": "assistant", "content": reply}, FOLLOW_UP]
    url = urls[1] if change.get("other_replica") else urls[0]
    tools = {"tools": change["tools"]} if "tools" in change else {}
    await chat(url, session, messages, **tools, **sampling)


async def replayed(settings: Settings, session: str) -> list[SegmentFinalized]:
    out = io.BytesIO()
    await replay(settings, ReplayOptions(session=session), JsonlSink(out))
    return [SegmentFinalized.model_validate_json(line) for line in out.getvalue().splitlines()]


def trainable(segment: SegmentFinalized, source: int) -> list[int]:
    return [
        p
        for p, (m, s) in enumerate(zip(segment.loss_mask, segment.logprob_source, strict=True))
        if m and s == source
    ]


async def test_divergences_are_classified_recomputed_and_replayed_as_split_or_last_step(
    stack_settings: Settings, tmp_path: Path
) -> None:
    metrics_port = free_port()
    settings = stack_settings.model_copy(
        update={"divergence_policy": "recompute", "recompute_metrics_port": metrics_port}
    )
    ingress_a, url_a = start_ingress(settings, tmp_path, "ingress-a")
    ingress_b, url_b = start_ingress(settings, tmp_path, "ingress-b")
    processes = [ingress_a, ingress_b, start_worker(settings, tmp_path)]
    processes.append(start_recompute(settings, tmp_path))
    tag = uuid.uuid4().hex[:6]
    sessions = {name: f"{name}-{tag}" for name in SCENARIOS}
    try:
        await asyncio.gather(
            *(
                run_scenario((url_a, url_b), sessions[name], change)
                for name, (_, change) in SCENARIOS.items()
            )
        )
        async with httpx.AsyncClient() as http:
            for session in sessions.values():
                (await http.post(f"{url_a}/sess/{session}/finalize", json={})).raise_for_status()
        live = await read_until(
            settings,
            settings.topic("segments"),
            TypeAdapter(SegmentFinalized),
            lambda got: {s.session_id for s in got} >= set(sessions.values()),
            timeout_s=180,
        )
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    finally:
        for proc in processes:
            proc.stop()

    tokenizer = load_tokenizer(settings.model_path)
    renderer = ChatRenderer(tokenizer)
    think = list(tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False))
    split_settings = settings.model_copy(update={"divergence_policy": "split"})
    last_step_settings = split_settings.model_copy(update={"build_mode": "last-step"})
    recomputed_total = 0
    for name, (expected, change) in SCENARIOS.items():
        session = sessions[name]
        first, second = await recorded_steps(settings, session, 2)
        assert (first.prefix, second.prefix) == ("rendered", "rendered")
        [segment] = [s for s in live if s.session_id == session]
        divergence = expected or next(
            kind for kind in ("template", "retokenization") if kind in segment.diagnostics
        )
        assert segment.diagnostics.get(divergence) == 1, (name, segment.diagnostics)
        prompt = second.prompt_tail_ids
        assert segment.token_ids == prompt + second.completion_ids
        # The second turn: sampled, exactly as the engine made it.
        completion = range(len(prompt), len(segment.token_ids))
        assert trainable(segment, LOGPROB_SOURCE_SAMPLED)[-len(completion) :] == list(completion)
        assert segment.logprobs[len(prompt) :] == second.completion_logprobs
        assert not any(math.isnan(lp) for lp in segment.logprobs)
        temperature = change.get("temperature", 1.0)
        assert {s.sampling.logprobs_mode for s in segment.steps if s.sampling} == {
            "processed_logprobs"
        }
        assert {s.sampling.temperature for s in segment.steps if s.sampling} == {temperature}
        # Processed logprobs are the prompt logprobs' (raw) distribution only at temperature 1.
        direct = await engine_prompt_logprobs(settings.engine_url, segment.token_ids)
        sampled = [segment.logprobs[p] for p in completion]
        raw = [direct[p] for p in completion]
        assert (sampled == pytest.approx(raw, abs=1e-4)) == (temperature == 1.0), (sampled, raw)

        # Replayed with split: a divergence starts a new segment with only its own turn trainable.
        split = await replayed(split_settings, session)
        if divergence == "cache_miss":  # the rendered prompt extended the first turn's tokens
            assert segment.diagnostics.get("rebuilt") is None and len(split) == 1
            assert trainable(segment, LOGPROB_SOURCE_RECOMPUTED) == []
        else:
            assert segment.diagnostics["rebuilt"] == 1
            kept, fresh = split
            assert fresh.split_reason == divergence and kept.split_reason is None
            assert kept.token_ids == first.prompt_tail_ids + first.completion_ids
            assert fresh.token_ids == segment.token_ids
            assert trainable(fresh, LOGPROB_SOURCE_SAMPLED) == list(completion)
            turn = segment.steps[0]
            assert [s.step_id for s in segment.steps] == [first.step_id, second.step_id]
            # Tokens up to the first one that differs from what the engine saw keep their
            # sampled logprobs (same context); the rest of the turn is recomputed...
            same = common_prefix(kept.token_ids, segment.token_ids)
            span = range(turn.completion_start, turn.completion_end)
            rebuilt = [p for p in span if p >= same]
            if temperature == 1.0:
                # Live (recompute): the first turn stays trainable in the rebuilt context, its
                # logprobs recomputed — each the engine's own prompt logprob for that token.
                recomputed = trainable(segment, LOGPROB_SOURCE_RECOMPUTED)
                assert recomputed == rebuilt
                assert [segment.logprob_source[p] for p in span] == [
                    1 if p < same else 3 for p in span
                ]
                assert [segment.logprobs[p] for p in span] == [direct[p] for p in span]
                recomputed_total += len(recomputed)
            else:
                # ...except where prompt logprobs (raw) are not the turn's (processed at 0.7):
                # masked and counted.
                assert rebuilt and trainable(segment, LOGPROB_SOURCE_RECOMPUTED) == []
                assert [segment.loss_mask[p] for p in rebuilt] == [0] * len(rebuilt)
                assert [segment.logprob_source[p] for p in rebuilt] == [0] * len(rebuilt)
                assert segment.diagnostics["recompute_masked_processed"] == len(rebuilt)

        # Replayed with last-step: the final conversation re-rendered by the chat template.
        lasts = await replayed(last_step_settings, session)
        assert len(lasts) == len(split) and {s.build_mode for s in lasts} == {"last-step"}
        last = lasts[-1]
        conversation = [Message.from_template_dict(m) for m in second.new_messages]
        conversation.append(Message.from_template_dict(second.response_message))
        tools = TOOLS if name == "tools" else []
        assert segment.build_mode == "concat"
        assert last.token_ids == renderer.full_prompt(conversation, tools, {}, False)
        assert last.token_ids != segment.token_ids
        # The last generated turn is placed in the render; Qwen3 writes an empty think block into
        # the last one that the model never generated: masked (source none), not trained.
        opening, closing = last.steps[-1].completion_start, last.steps[-1].completion_end
        assert last.token_ids[opening : opening + len(think)] == think
        assert set(last.loss_mask[opening:closing]) == {0}
        assert set(last.logprob_source[opening:closing]) == {LOGPROB_SOURCE_NONE}
        assert set(last.logprob_source) <= {LOGPROB_SOURCE_NONE, LOGPROB_SOURCE_SAMPLED}

    # A replay with the live settings recomputes the same logprobs: the same bytes.
    for session in sessions.values():
        again = await replayed(settings, session)
        assert [s.model_dump_json() for s in again] == [
            s.model_dump_json() for s in live if s.session_id == session
        ]
    assert recomputed_total > 0
    assert "titoflow_recompute_queue 0.0" in metrics
    assert "titoflow_recompute_seconds_count" in metrics


def test_the_kill_switch_turns_recompute_into_split(stack_settings: Settings) -> None:
    killed = stack_settings.model_copy(
        update={"divergence_policy": "recompute", "recompute_disabled": True}
    )
    assert not killed.recompute_enabled and not assembler_for(killed).recompute
    assert assembler_for(killed.model_copy(update={"recompute_disabled": False})).recompute

"""Two real vLLM CPU engines behind one ingress: sessions stick to one engine, move when a
published control event drains it (calls in flight there finish), and nothing is lost: every
call is one recorded step with the engine's exact tokens, and every session one segment made of
exactly those steps. A replica started after the drain starts with the engine drained (it
replays the control log); removing the engine (CLI) and adding it back (admin endpoint) brings
its sessions back to it, per the hash. With group routing, the sessions of one instance (opened
with it, or naming it on each call) share one engine whatever their own hash, and move together
when it drains.

The second engine is started here (~50 s, ~4 GB); TITOFLOW_TEST_SECOND_ENGINE_URL points the
test at one already running instead (developers sharing a machine; CI starts its own)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from cli.dev.stack import settings_env, start_worker
from ingress.app import create_app
from tests.support.apps import ADMIN_TOKEN, admin, serving, until
from tests.support.engines import SMALL_KV_CACHE_BYTES, engine_for_tests
from tests.support.topics import engine_generate, sessions_recorded
from tests.support.witness import Witness
from titoflow.engine.pool import EnginePool
from titoflow.settings import Settings
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

pytestmark = pytest.mark.engine

PER_ENGINE = 6  # sessions whose first choice is each engine
TURNS = 5
DRAIN_TURN = 2  # 0-based: the engine is drained while this turn's calls are in flight
BACK_TURN = 4  # removed and added back before this turn


@pytest.fixture(scope="module")
def second_engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_dir = tmp_path_factory.mktemp("vllm-second")
    yield from engine_for_tests(
        "TITOFLOW_TEST_SECOND_ENGINE_URL", model_dir, log_dir, kv_cache_bytes=SMALL_KV_CACHE_BYTES
    )


def seed(session: int, turn: int) -> int:
    return 1000 * session + turn


def max_tokens(turn: int) -> int:
    return 24 if turn == DRAIN_TURN else 8  # the drained turn's calls stay in flight longer


async def test_sessions_stick_move_on_drain_and_nothing_is_lost(
    stack_settings: Settings, second_engine_url: str, witness: Witness, tmp_path: Path
) -> None:
    first_url = stack_settings.engine_url.rstrip("/")
    second_url = witness.front(second_engine_url)  # its samples are witnessed too
    settings = stack_settings.model_copy(
        update={"engine_urls": second_url, "admin_token": ADMIN_TOKEN}
    )
    app = create_app(settings)
    worker = start_worker(settings, tmp_path)
    try:
        async with serving(app) as url, httpx.AsyncClient(timeout=60) as http:
            pool: EnginePool = app.state.engines
            # As many sessions on each engine: the routing decides, the test only picks names.
            by_first: dict[str, list[str]] = {first_url: [], second_url: []}
            for n in range(1000):
                name = f"eng-{n}"
                group = by_first[pool.ranking(name)[0]]
                if len(group) < PER_ENGINE:
                    group.append(name)
            sessions = by_first[first_url] + by_first[second_url]
            assert len(sessions) == 2 * PER_ENGINE
            conversations: dict[str, list[Any]] = {
                s: [{"role": "user", "content": f"Task {i}: list the files."}]
                for i, s in enumerate(sessions)
            }
            clients = {
                s: AsyncOpenAI(base_url=f"{url}/sess/{s}/v1", api_key="unused", max_retries=0)
                for s in sessions
            }

            async def turn(index: int, session: str, number: int) -> None:
                messages = conversations[session]
                request: dict[str, Any] = {
                    "model": "policy",
                    "messages": messages,
                    "max_tokens": max_tokens(number),
                    "seed": seed(index, number),
                }
                if index % 2:  # half the sessions stream
                    stream = await clients[session].chat.completions.create(**request, stream=True)
                    reply = "".join(
                        [c.choices[0].delta.content or "" async for c in stream if c.choices]
                    )
                else:
                    response = await clients[session].chat.completions.create(**request)
                    reply = response.choices[0].message.content or ""
                messages += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"Turn {number + 1}: go on."},
                ]

            in_flight_at_drain = 0
            for number in range(TURNS):
                if number == BACK_TURN:
                    # Removed by the CLI, added back by the admin endpoint: a new engine to the
                    # pool, with the URL (so the hash) of the old one.
                    cli = await asyncio.create_subprocess_exec(
                        *[sys.executable, "-m", "cli", "control", "engine-remove", second_url],
                        env=settings_env(settings),
                    )
                    assert await cli.wait() == 0

                    async def removed() -> bool:
                        return second_url not in {s.url for s in pool.status()}

                    await until(removed, "engine removed")
                    added = await admin(http, url, type="engine_added", url=second_url)
                calls = asyncio.gather(*(turn(i, s, number) for i, s in enumerate(sessions)))
                if number == DRAIN_TURN:
                    # Drain while calls are running on that engine: they must finish there.
                    async with asyncio.timeout(60):
                        while not (in_flight_at_drain := in_flight(pool, second_url)):
                            await asyncio.sleep(0.002)
                    drained = await admin(http, url, type="engine_drained", url=second_url)
                await calls
                if number == DRAIN_TURN:
                    # A replica started now replays the log: the engine is drained there too.
                    async with serving(create_app(settings)) as late_url:
                        late = (await http.get(f"{late_url}/v1/rollout/engines")).json()
            for session in sessions:
                finalized = await http.post(f"{url}/sess/{session}/finalize", json={})
                finalized.raise_for_status()
            for client in clients.values():
                await client.close()
        steps, segments = await sessions_recorded(settings, sessions, len(sessions) * TURNS)
    finally:
        worker.stop()

    # Nothing lost, nothing twice: one step per call, one segment per session.
    assert len(steps) == len(sessions) * TURNS
    assert len({s.step_id for s in steps}) == len(steps)
    assert sorted(s.session_id for s in segments) == sorted(sessions)
    served = {s: [e for e in steps if e.session_id == s] for s in sessions}
    for session in sessions:
        chain = served[session]
        assert [s.prefix for s in chain] == ["rendered"] + ["tito"] * (TURNS - 1)
        assert [s.parent_step_id for s in chain] == [None] + [s.step_id for s in chain[:-1]]

    # Sticky: until the drain every step of a session ran on its first-choice engine.
    engines = {s: [e.engine_url for e in served[s]] for s in sessions}
    for first, group in by_first.items():
        for session in group:
            assert engines[session][:DRAIN_TURN] == [first] * DRAIN_TURN
    # The calls in flight on the drained engine finished there; later steps moved, as TITO
    # steps (only the new engine's prefix cache missed).
    assert serving_flags(drained) == serving_flags(late) == {first_url: True, second_url: False}
    drain_turn = [engines[s][DRAIN_TURN] for s in by_first[second_url]]
    assert drain_turn.count(second_url) >= in_flight_at_drain > 0
    for session in sessions:
        assert engines[session][DRAIN_TURN + 1 : BACK_TURN] == [first_url] * (
            BACK_TURN - DRAIN_TURN - 1
        )
    # Added back, the engine takes its sessions again (and only those).
    assert serving_flags(added) == {first_url: True, second_url: True}
    for first, group in by_first.items():
        for session in group:
            assert engines[session][BACK_TURN:] == [first] * (TURNS - BACK_TURN)

    # Exact: each step's tokens are what its engine samples for the recorded prompt, and each
    # segment is its session's steps, token for token.
    terminator = ChatRenderer(load_tokenizer(settings.model_path)).terminator_id
    for index, session in enumerate(sessions):
        [segment] = [s for s in segments if s.session_id == session]
        sent: list[int] = []
        checks = []
        for number, step in enumerate(served[session]):
            prompt = sent + step.prompt_tail_ids
            sent = prompt + step.completion_ids
            checks.append(
                engine_generate(
                    step.engine_url, prompt, seed(index, number), terminator, max_tokens(number)
                )
            )
        for step, direct in zip(served[session], await asyncio.gather(*checks), strict=True):
            assert step.completion_ids == direct["token_ids"]
            assert step.completion_logprobs == [e["logprob"] for e in direct["logprobs"]["content"]]
        assert segment.token_ids == sent
        assert [s.step_id for s in segment.steps] == [s.step_id for s in served[session]]
        generated = [i for i, m in enumerate(segment.loss_mask) if m]
        assert [segment.logprobs[i] for i in generated] == [
            lp for s in served[session] for lp in s.completion_logprobs
        ]


def serving_flags(answer: dict[str, Any]) -> dict[str, bool]:
    return {e["url"]: e["serving"] for e in answer["engines"]}


def in_flight(pool: EnginePool, url: str) -> int:
    return next(s.in_flight for s in pool.status() if s.url == url)


GROUP_TURNS = 3
GROUP_DRAIN_TURN = 2  # the group's engine is drained before this turn


async def test_a_group_shares_one_engine_and_moves_together_when_it_drains(
    stack_settings: Settings, second_engine_url: str, witness: Witness, tmp_path: Path
) -> None:
    first_url = stack_settings.engine_url.rstrip("/")
    second_url = witness.front(second_engine_url)
    settings = stack_settings.model_copy(
        update={
            "engine_urls": second_url,
            "admin_token": ADMIN_TOKEN,
            "engine_group_routing": True,
        }
    )
    app = create_app(settings)
    worker = start_worker(settings, tmp_path)
    try:
        async with serving(app) as url, httpx.AsyncClient(timeout=60) as http:
            pool: EnginePool = app.state.engines
            instance = next(
                f"prompt-{n}" for n in range(100) if pool.ranking(f"prompt-{n}")[0] == second_url
            )
            # Sessions whose own hash picks each engine: by session they would spread.
            own: dict[str, list[str]] = {first_url: [], second_url: []}
            for n in range(1000):
                name = f"grp-{n}"
                if len(own[pool.ranking(name)[0]]) < 2:
                    own[pool.ranking(name)[0]].append(name)
            opened = [own[first_url][0], own[second_url][0]]  # the driver names the instance
            naming = [own[first_url][1], own[second_url][1]]  # each call names it
            group = opened + naming
            for session in opened:
                answer = await http.post(
                    f"{url}/v1/sessions", json={"session_id": session, "instance_id": instance}
                )
                answer.raise_for_status()
            clients = {
                s: AsyncOpenAI(
                    base_url=f"{url}/sess/{s}/v1",
                    api_key="unused",
                    max_retries=0,
                    default_headers={"X-Instance-Id": instance} if s in naming else None,
                )
                for s in group
            }
            conversations: dict[str, list[Any]] = {
                s: [{"role": "user", "content": "Solve the task: list the files."}] for s in group
            }

            async def turn(index: int, session: str, number: int) -> None:
                response = await clients[session].chat.completions.create(
                    model="policy",
                    messages=conversations[session],
                    max_tokens=8,
                    seed=seed(index, number),
                )
                conversations[session] += [
                    {"role": "assistant", "content": response.choices[0].message.content or ""},
                    {"role": "user", "content": f"Turn {number + 1}: go on."},
                ]

            for number in range(GROUP_TURNS):
                if number == GROUP_DRAIN_TURN:
                    await admin(http, url, type="engine_drained", url=second_url)
                await asyncio.gather(*(turn(i, s, number) for i, s in enumerate(group)))
            for session in group:
                (await http.post(f"{url}/sess/{session}/finalize", json={})).raise_for_status()
            for client in clients.values():
                await client.close()
        steps, segments = await sessions_recorded(settings, group, len(group) * GROUP_TURNS)
    finally:
        worker.stop()
    assert len(steps) == len(group) * GROUP_TURNS
    engines = {s: [e.engine_url for e in steps if e.session_id == s] for s in group}
    # The whole group on the instance's engine, including the sessions whose own hash picks
    # the other one; drained, the group moves to its next engine together.
    for session in group:
        assert engines[session] == [second_url] * GROUP_DRAIN_TURN + [first_url] * (
            GROUP_TURNS - GROUP_DRAIN_TURN
        )
    # Each session stays one chain on either engine (TITO after the first step).
    for session in group:
        chain = [e for e in steps if e.session_id == session]
        assert [s.prefix for s in chain] == ["rendered"] + ["tito"] * (GROUP_TURNS - 1)
        [segment] = [s for s in segments if s.session_id == session]
        assert [s.step_id for s in segment.steps] == [s.step_id for s in chain]

"""The engine pool's routing on ENGINE DOUBLES (tests/support/doubles.py StubEngine): stickiness,
minimal movement on add/drain, weights, fallback past unhealthy/overloaded engines, retries,
drain and removal with calls in flight; control events mapped onto the pool, their replay, and
the engine driver on an engine the log added. The same behaviour on two real vLLM engines:
tests/e2e/test_e2e_engines.py."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from prometheus_client import REGISTRY

from ingress.control.control_state import ControlState
from ingress.control.engine_driver import EngineDriver
from ingress.control.pool_control import apply_to_pool
from schemas.control import (
    AnyControl,
    EngineAdded,
    EngineDrained,
    EngineRemoved,
    Pause,
    Resume,
    SetWeightVersion,
    control_adapter,
)
from tests.support.doubles import ControlledStubEngine, pool_of
from titoflow.engine.api import GenerateParams
from titoflow.engine.pool import EnginePool, EngineSpec, parse_engine_specs
from titoflow.errors import EngineUnavailable, Overloaded
from titoflow.settings import Settings

PARAMS = GenerateParams(max_tokens=1)
SESSIONS = [f"session-{i}" for i in range(300)]


async def served_by(pool: EnginePool, session: str) -> str:
    return (await pool.generate([1, 2], PARAMS, f"r-{session}", session_id=session)).engine_url


def first_choices(pool: EnginePool) -> dict[str, str]:
    return {s: pool.ranking(s)[0] for s in SESSIONS}


def test_engine_urls_setting() -> None:
    settings = Settings(
        engine_url="http://a:8000/", engine_urls="sglang=http://b:30000, http://c:8000,"
    )
    assert parse_engine_specs(settings) == [
        EngineSpec("http://a:8000"),
        EngineSpec("http://b:30000", "sglang"),
        EngineSpec("http://c:8000"),
    ]
    assert parse_engine_specs(Settings(engine_urls="http://a", engine_backend="sglang")) == [
        EngineSpec("http://a", "sglang")
    ]
    with pytest.raises(ValueError, match="backend"):
        parse_engine_specs(Settings(engine_urls="tgi=http://a"))


async def test_sessions_stick_and_spread() -> None:
    pool, stubs = pool_of("http://a", "http://b", "http://c")
    for session in SESSIONS[:60]:
        assert {await served_by(pool, session) for _ in range(3)} == {pool.ranking(session)[0]}
    shares = Counter(first_choices(pool).values())
    assert set(shares) == set(stubs) and min(shares.values()) > len(SESSIONS) / 6


async def test_add_and_drain_move_only_the_sessions_they_must() -> None:
    pool, _ = pool_of("http://a", "http://b", "http://c")
    before = first_choices(pool)
    pool.drain("http://b")
    drained = first_choices(pool)
    assert "http://b" not in drained.values()
    assert all(drained[s] == before[s] for s in SESSIONS if before[s] != "http://b")
    pool.add(EngineSpec("http://b"))  # back in service: every session back where it was
    assert first_choices(pool) == before
    pool.add(EngineSpec("http://d"))
    grown = first_choices(pool)
    moved = [s for s in SESSIONS if grown[s] != before[s]]
    assert moved and all(grown[s] == "http://d" for s in moved)
    assert len(moved) < len(SESSIONS) / 2


async def test_a_canary_weight_takes_its_share() -> None:
    pool, _ = pool_of("http://a", "http://b")
    pool.add(EngineSpec("http://canary", weight=0.1))
    share = Counter(first_choices(pool).values())["http://canary"] / len(SESSIONS)
    assert 0.01 < share < 0.15  # expected 0.1 / 2.1 ≈ 0.05


async def test_unhealthy_engines_are_skipped_until_they_recover() -> None:
    pool, stubs = pool_of("http://a", "http://b")
    session = next(s for s in SESSIONS if pool.ranking(s)[0] == "http://a")
    stubs["http://a"].down = True
    assert await served_by(pool, session) == "http://b"  # failed on a, retried on b
    assert len(stubs["http://a"].calls) == 1
    assert await served_by(pool, session) == "http://b"  # a is marked: not tried again
    assert len(stubs["http://a"].calls) == 1
    stubs["http://a"].down = False
    await pool.probe()
    assert await served_by(pool, session) == "http://a"
    assert REGISTRY.get_sample_value("titoflow_engine_fallbacks_total", {"reason": "failed"})
    assert REGISTRY.get_sample_value("titoflow_engine_fallbacks_total", {"reason": "unhealthy"})
    stubs["http://a"].down = stubs["http://b"].down = True
    with pytest.raises(EngineUnavailable):
        await served_by(pool, session)


async def test_overloaded_engines_pass_calls_on_to_the_next() -> None:
    pool, stubs = pool_of("http://a", "http://b", max_in_flight=1)
    session = next(s for s in SESSIONS if pool.ranking(s)[0] == "http://a")
    stubs["http://a"].release.clear()
    held = asyncio.create_task(served_by(pool, session))
    await asyncio.sleep(0)
    assert await served_by(pool, session) == "http://b"
    stubs["http://a"].release.set()
    assert await held == "http://a"
    assert await served_by(pool, session) == "http://a"


async def test_a_call_no_engine_has_room_for_is_refused_before_any_engine_sees_it() -> None:
    pool, stubs = pool_of("http://a", "http://b", max_in_flight=1, in_flight_limit=2)
    for stub in stubs.values():
        stub.release.clear()
    held = [asyncio.create_task(served_by(pool, s)) for s in SESSIONS[:4]]
    await asyncio.sleep(0)
    assert sorted(s.in_flight for s in pool.status()) == [2, 2]
    calls = sum(len(stub.calls) for stub in stubs.values())
    with pytest.raises(Overloaded) as refused:
        await served_by(pool, SESSIONS[4])
    assert (refused.value.what, refused.value.retry_after_s) == ("engine", 1)
    assert sum(len(stub.calls) for stub in stubs.values()) == calls  # no engine was called
    with pytest.raises(Overloaded):
        [_ async for _ in pool.generate_stream([1], PARAMS, "r", session_id=SESSIONS[4])]
    for stub in stubs.values():
        stub.release.set()
    await asyncio.gather(*held)
    assert await served_by(pool, SESSIONS[4]) in {"http://a", "http://b"}  # room again


def test_the_ingress_reserves_a_place_among_the_healthy_engines_before_it_renders() -> None:
    pool, _ = pool_of("http://a", "http://b", in_flight_limit=2)
    places = [pool.reserve() for _ in range(4)]  # two engines, two calls each
    with pytest.raises(Overloaded) as refused:
        pool.reserve()
    assert refused.value.reason == "overloaded_engine"
    places.pop()()
    places.append(pool.reserve())  # a freed place is taken again
    pool.drain("http://b")  # one engine left: its two places are all there is
    for release in places[:2]:
        release()
    with pytest.raises(Overloaded):
        pool.reserve()
    for release in places[2:]:
        release()
    assert pool.reserved == 0
    unbounded, _ = pool_of("http://a")
    assert [unbounded.reserve() for _ in range(100)] and unbounded.reserved == 0


async def test_drain_and_remove_let_calls_in_flight_finish() -> None:
    pool, stubs = pool_of("http://a", "http://b")
    session = next(s for s in SESSIONS if pool.ranking(s)[0] == "http://a")
    stubs["http://a"].release.clear()
    held = asyncio.create_task(served_by(pool, session))
    await asyncio.sleep(0)
    pool.drain("http://a")
    assert await served_by(pool, session) == "http://b"
    pool.remove("http://a")
    assert not stubs["http://a"].closed  # a call is still in flight there
    stubs["http://a"].release.set()
    assert await held == "http://a"
    assert stubs["http://a"].closed
    assert [s.url for s in pool.status()] == ["http://b"]
    pool.drain("http://b")
    with pytest.raises(EngineUnavailable, match="no engine is serving"):
        await served_by(pool, session)


async def test_streams_are_retried_only_before_their_first_token() -> None:
    pool, stubs = pool_of("http://a", "http://b")
    session = next(s for s in SESSIONS if pool.ranking(s)[0] == "http://a")
    stubs["http://a"].down = True
    chunks = [c async for c in pool.generate_stream([1], PARAMS, "r", session_id=session)]
    assert {c.engine_url for c in chunks} == {"http://b"}
    await pool.probe()
    stubs["http://a"].down = False
    await pool.probe()
    stubs["http://a"].break_mid_stream = True
    got = []
    with pytest.raises(EngineUnavailable, match="mid-stream"):
        async for chunk in pool.generate_stream([1], PARAMS, "r", session_id=session):
            got.append(chunk)
    assert [c.engine_url for c in got] == ["http://a"]
    assert stubs["http://b"].calls == [session]


# --- engine control events (ingress/control/pool_control.py) on the pool directly
# -------------------

ADD_C = EngineAdded(event_time=0, url="http://c/", weight=0.5)
CONTROL_LOG: list[AnyControl] = [
    ADD_C,
    EngineDrained(event_time=0, url="http://a"),
    SetWeightVersion(event_time=0, version="v1"),  # not about engines: the pool ignores it
    EngineAdded(event_time=0, url="http://d", backend="sglang"),
    EngineRemoved(event_time=0, url="http://d"),
]


def status(pool: EnginePool) -> list[tuple[str, str, float, bool]]:
    return sorted((s.url, s.backend, s.weight, s.serving) for s in pool.status())


async def test_each_engine_event_is_its_pool_operation() -> None:
    pool, stubs = pool_of("http://a", "http://b")
    apply_to_pool(pool, ADD_C)
    assert status(pool) == [
        ("http://a", "vllm", 1.0, True),
        ("http://b", "vllm", 1.0, True),
        ("http://c", "vllm", 0.5, True),  # the URL as the pool spells it
    ]
    before = first_choices(pool)
    apply_to_pool(pool, EngineDrained(event_time=0, url="http://b"))
    assert "http://b" not in first_choices(pool).values()
    assert ("http://b", "vllm", 1.0, False) in status(pool)
    apply_to_pool(pool, EngineAdded(event_time=0, url="http://b"))  # back: sessions too
    assert first_choices(pool) == before
    apply_to_pool(pool, EngineRemoved(event_time=0, url="http://b"))
    assert [s.url for s in pool.status()] == ["http://a", "http://c"]
    await asyncio.sleep(0)  # the close is a task: no call was in flight there
    assert stubs["http://b"].closed
    apply_to_pool(pool, EngineAdded(event_time=0, url="http://b"))  # a new client, same hash
    assert first_choices(pool) == before and not stubs["http://b"].closed


async def test_replaying_the_log_yields_the_same_pool_on_every_replica() -> None:
    running, _ = pool_of("http://a", "http://b")
    for event in CONTROL_LOG:
        apply_to_pool(running, event)
    # A replica started later with the same settings reads the log from its beginning, once
    # or (a reconnect) twice over: the same pool, the drained engine drained, the removed gone.
    for passes in (1, 2):
        late, _ = pool_of("http://a", "http://b")
        for event in [control_adapter.validate_json(e.model_dump_json()) for e in CONTROL_LOG]:
            for _ in range(passes):
                apply_to_pool(late, event)
        assert (
            status(late)
            == status(running)
            == [
                ("http://a", "vllm", 1.0, False),
                ("http://b", "vllm", 1.0, True),
                ("http://c", "vllm", 0.5, True),
            ]
        )
        assert first_choices(late) == first_choices(running)


async def test_an_engine_added_by_the_log_is_driven_to_its_pause_and_version() -> None:
    stubs: dict[str, ControlledStubEngine] = {}

    def make(spec: EngineSpec) -> ControlledStubEngine:
        stubs[spec.url] = ControlledStubEngine(spec.url)
        return stubs[spec.url]

    pool = EnginePool([EngineSpec("http://a")], make)
    state = ControlState()
    driver = EngineDriver(state, pool.engines)
    task = asyncio.create_task(driver.run())

    def apply(event: AnyControl) -> None:  # as the ingress subscribes them, in this order
        state.apply(event)
        apply_to_pool(pool, event)
        driver.notify(event)

    async def settled() -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    try:
        apply(SetWeightVersion(event_time=0, version="v2"))
        apply(Pause(event_time=0, mode="keep"))
        await settled()
        apply(EngineAdded(event_time=0, url="http://new"))
        await settled()
        assert stubs["http://new"].control_calls == ["pause:keep", "version:v2"]
        apply(EngineRemoved(event_time=0, url="http://new"))
        apply(Resume(event_time=0))
        await settled()
        assert stubs["http://new"].control_calls == ["pause:keep", "version:v2"]  # not driven
        assert stubs["http://a"].control_calls == ["pause:keep", "version:v2", "resume"]
    finally:
        task.cancel()

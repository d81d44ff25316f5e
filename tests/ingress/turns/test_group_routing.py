"""Group routing (``engine_group_routing``): the routing key a session's calls take
(titoflow/engine/groups.py) and the pool's choice of an engine for it (titoflow/engine/pool.py
``rank``/``choose``), as properties over random pools, health and load; then on the pool and
the ingress service with ENGINE DOUBLES (tests/support/doubles.py StubEngine), across two replicas
on the real broker. The same on two real
vLLM engines: tests/e2e/test_e2e_engines.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

import openai
from hypothesis import given
from hypothesis import strategies as st

from ingress.app import create_app
from ingress.turns.budgets import SessionBudgets
from ingress.turns.chains import ChainStore
from ingress.turns.service import ChatService, ServiceOptions
from ingress.turns.turn import ChatTurn, SessionRef
from schemas.events import SessionOptions
from tests.support.apps import serving, until
from tests.support.doubles import RecordingPublisher, pool_of
from tests.support.families import qwen3
from titoflow.client.rollout import RolloutClient
from titoflow.engine.api import GenerateParams
from titoflow.engine.groups import RoutingKeys
from titoflow.engine.pool import EngineSpec, EngineStatus, choose, rank
from titoflow.settings import Settings
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer

GROUP = [f"rollout-{i}" for i in range(8)]  # one GRPO group: 8 sessions of one prompt
PARAMS = GenerateParams(max_tokens=1)

# --- the key a session routes by ------------------------------------------------------------

sessions = st.sampled_from(["s1", "s2", "s3", "s4"])
instances = st.none() | st.sampled_from(["p1", "p2"])
# ("open", session, instance) or ("call", session, instance): what a replica sees, in order.
traffic = st.lists(st.tuples(st.sampled_from(["open", "call"]), sessions, instances), max_size=30)


@given(traffic)
def test_a_session_keeps_the_key_its_first_call_or_its_opening_gave(
    seen: list[tuple[str, str, str | None]],
) -> None:
    keys = RoutingKeys(by_instance=True, kept=100)
    first: dict[str, str] = {}  # the key each session's first open or call decided
    for what, session, instance in seen:
        if what == "open":
            keys.opened(session, instance)
            if instance is not None:
                first.setdefault(session, instance)
            continue
        first.setdefault(session, instance or session)
        # Sticky: whatever later calls name, the session keeps its first key (and engine).
        assert keys.key(session, instance) == first[session]
    plain = RoutingKeys(by_instance=False, kept=100)
    for _what, session, instance in seen:
        plain.opened(session, instance)
        assert plain.key(session, instance) == session  # off: the session id, as before


def test_a_forgotten_session_picks_its_key_again() -> None:
    keys = RoutingKeys(by_instance=True, kept=2)
    assert keys.key("s1", None) == "s1"
    assert keys.key("s2", "p1") == "p1"
    assert keys.key("s1", "p1") == "s1"  # sticky; s1 is now the most recently used
    assert keys.key("s3", "p2") == "p2"  # two kept: s2 forgotten
    assert keys.key("s1", "p1") == "s1"  # still known
    assert keys.key("s2", None) == "s2"  # forgotten: picked again, from this call


# --- the engine a key's call goes to --------------------------------------------------------

engine_states = st.lists(
    st.builds(
        EngineStatus,
        url=st.sampled_from([f"http://e{i}" for i in range(6)]),
        backend=st.just("vllm"),
        weight=st.sampled_from([0.1, 1.0, 2.0]),
        serving=st.booleans(),
        healthy=st.booleans(),
        in_flight=st.integers(0, 6),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda e: e.url,
)


@given(engine_states, st.sampled_from([0, 1, 3]), st.sampled_from([0, 2, 6]), st.text(min_size=1))
def test_a_group_lands_on_its_first_healthy_engine_with_room_or_falls_back_together(
    engines: list[EngineStatus], max_in_flight: int, in_flight_limit: int, instance: str
) -> None:
    keys = RoutingKeys(by_instance=True, kept=100)
    serving = [e for e in engines if e.serving]
    healthy = [e for e in serving if e.healthy]

    def decide(session: str) -> EngineStatus | str | None:
        try:
            return choose(
                rank(keys.key(session, instance), engines), set(), max_in_flight, in_flight_limit
            )
        except Exception as exc:  # no engine serving: the same refusal for all
            return type(exc).__name__

    decisions = [decide(s) for s in GROUP]
    assert all(d == decisions[0] for d in decisions)  # the whole group, one decision
    decision = decisions[0]
    if not serving:
        assert decision == "EngineUnavailable"
        return
    ranked = rank(instance, engines)
    assert {e.url for e in ranked} == {e.url for e in serving}  # drained engines never rank

    def has_room(e: EngineStatus) -> bool:
        return all(not bound or e.in_flight < bound for bound in (max_in_flight, in_flight_limit))

    first = ranked[0]
    if first.healthy and has_room(first):
        assert decision is first  # the group's engine, while healthy and under capacity
    if not healthy:
        assert decision is first  # every mark says down: the call probes the first
        return
    with_room = [e for e in ranked if e.healthy and has_room(e)]
    if with_room:  # the first healthy engine with room, in the group's own order
        assert decision is with_room[0]
    elif in_flight_limit and min(e.in_flight for e in healthy) >= in_flight_limit:
        assert decision is None  # refused only when every healthy engine is at the limit
    else:  # all busy past max_in_flight: the least loaded
        assert isinstance(decision, EngineStatus) and decision.healthy
        assert decision.in_flight == min(e.in_flight for e in healthy)


def test_session_routing_spreads_the_group_group_routing_gathers_it() -> None:
    engines = [EngineStatus(f"http://e{i}", "vllm", 1.0, True, True, 0) for i in range(4)]
    apart = {rank(RoutingKeys(False, 100).key(s, "p1"), engines)[0].url for s in GROUP}
    together = {rank(RoutingKeys(True, 100).key(s, "p1"), engines)[0].url for s in GROUP}
    assert len(apart) > 1 and together == {rank("p1", engines)[0].url}


# --- on the pool, and through the service -----------------------------------------------------


async def test_a_group_moves_together_when_its_engine_drains_or_is_full() -> None:
    pool, stubs = pool_of("http://a", "http://b", "http://c", max_in_flight=2)
    keys = RoutingKeys(by_instance=True, kept=100)
    home, second = pool.ranking("p1")[:2]

    async def served(session: str) -> str:
        key = keys.key(session, "p1")
        return (await pool.generate([1], PARAMS, f"r-{session}", session_id=key)).engine_url

    assert {await served(s) for s in GROUP} == {home}
    # Full (engine_max_in_flight): calls beyond it go to the group's second engine.
    stubs[home].release.clear()
    held = [asyncio.create_task(served(s)) for s in GROUP[:2]]
    await asyncio.sleep(0)
    assert await served(GROUP[2]) == second
    stubs[home].release.set()
    assert await asyncio.gather(*held) == [home, home]
    pool.drain(home)
    assert {await served(s) for s in GROUP} == {second}
    pool.add(EngineSpec(home))
    assert {await served(s) for s in GROUP} == {home}


async def test_the_service_routes_by_the_instance_of_the_open_call_or_of_the_first_call() -> None:
    pool, stubs = pool_of("http://a", "http://b", "http://c")
    tokenizer = qwen3()
    service = ChatService(
        renderer=ChatRenderer(tokenizer),
        tokenizer=tokenizer,
        engine=pool,
        publish=RecordingPublisher(),
        chains=ChainStore(100),
        options=ServiceOptions(max_model_len=4096, default_max_tokens=1),
        routing=RoutingKeys(by_instance=True, kept=100),
    )

    def turn(session: str, instance: str | None) -> ChatTurn:
        return ChatTurn(
            session=SessionRef(session_id=session, instance_id=instance),
            api="openai.chat",
            model="m",
            messages=(Message(role="user", content="Solve: 17 * 23"),),
        )

    async def engine_of(session: str, instance: str | None = None) -> str:
        return (await service.complete(turn(session, instance)))[0].step.engine_url

    # Opened with the instance, the scaffold's calls name none: the group's engine all along.
    for session in GROUP[:4]:
        await service.open_session(
            SessionRef(session_id=session, instance_id="p1"), None, {}, SessionOptions()
        )
    home = pool.ranking("p1")[0]
    assert {await engine_of(s) for s in GROUP[:4]} == {home}
    # Named by each call: the same engine.
    assert {await engine_of(s, "p1") for s in GROUP[4:]} == {home}
    # A session whose first call named no instance keeps its own engine when later ones do.
    loner = next(f"late-{i}" for i in range(100) if pool.ranking(f"late-{i}")[0] != home)
    own = await engine_of(loner)
    assert own != home and await engine_of(loner, "p1") == own
    assert Counter(key for stub in stubs.values() for key in stub.calls) == {
        "p1": len(GROUP),
        loner: 2,
    }


async def test_a_replica_that_never_saw_the_open_call_routes_the_session_with_its_group(
    settings: Settings,
) -> None:
    """Two ingress apps on the real broker (tansu), group routing on: the driver opens a session
    with its instance on one; the scaffold's calls, which name no instance, reach the other,
    which learns the instance from ``<prefix>.ended`` and routes them with the group."""
    grouped = settings.model_copy(update={"engine_group_routing": True})
    first, second = create_app(grouped), create_app(grouped)
    async with serving(first) as one, serving(second) as two:
        pool, stubs = pool_of("http://a", "http://b", "http://c")
        service: ChatService = second.state.service
        service.runner = replace(service.runner, engine=pool)
        async with RolloutClient(one, grouped) as driver:
            loner = next(
                f"moved-{i}"
                for i in range(100)
                if pool.ranking(f"moved-{i}")[0] != (pool.ranking("p1")[0])
            )
            await driver.open(session_id=loner, instance_id="p1")
            budgets: SessionBudgets = service.budgets

            async def known() -> bool:
                return budgets.get(loner) is not None

            await until(known, "the open call's instance on the other replica")
            client = openai.AsyncOpenAI(base_url=f"{two}/sess/{loner}/v1", api_key="k")
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Solve: 17 * 23"}], max_tokens=1
            )
            await client.close()
    assert {url: stub.calls for url, stub in stubs.items() if stub.calls} == {
        pool.ranking("p1")[0]: ["p1"]
    }

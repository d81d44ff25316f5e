"""Admission control and session budgets (issue 26, part 3) on the SCRIPTED ENGINE DOUBLE,
in-process: the bound on generations in flight (a fast 429 in each API's shape, Retry-After,
nothing published, its slot freed on every path, streams cut mid-way included) and the budgets a
rollout driver sets at open (a 403 no scaffold retries), as the openai and anthropic
SDKs see them; the budget on a second replica, through the real broker. The engine's own bound
(the pool's): tests/ingress/control/test_engine_pool.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from ingress.app import create_app
from ingress.turns.admission import InFlight
from ingress.turns.budgets import SessionBudgets
from ingress.turns.chains import ChainStore
from ingress.turns.service import ChatService, ServiceOptions, TokensSampled, TurnDone
from ingress.turns.turn import ChatTurn, SessionRef
from ingress.wire import anthropic_messages, openai_chat, session_routes
from schemas.events import SessionBudget, SessionBudgeted, SessionOpened, StepRecorded
from tests.support.apps import asgi_client, scripted_app, serving, until
from tests.support.doubles import RecordingPublisher, ScriptedEngine, StubEngine
from tests.support.families import qwen3
from titoflow.client.rollout import RolloutClient
from titoflow.engine.api import GenerateParams, Generation, GenerationChunk
from titoflow.engine.pool import EnginePool, EngineSpec
from titoflow.errors import EngineError, Overloaded, SessionBudgetExceeded
from titoflow.settings import Settings
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer

REPLY = "Fine, thanks.<|im_end|>"
ROUTERS = [
    openai_chat.router,
    anthropic_messages.router,
    session_routes.router,
    session_routes.driver_router,
]


class GatedEngine(ScriptedEngine):
    """Answers :data:`REPLY` to every call, once ``gate`` is open: a whole generation waits for
    it before anything, a stream after its first chunk (so a client can leave mid-stream). A
    session in ``failing`` fails at that point, as an engine that refused the request."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        super().__init__(tokenizer, replies)
        self.gate = asyncio.Event()
        self.waiting = 0
        self.failing: set[str] = set()

    async def _pass(self, session_id: str) -> None:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        if session_id in self.failing:
            raise EngineError("the engine refused the request (scripted)")

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation:
        await self._pass(session_id)
        self.replies.append(REPLY)
        return await super().generate(prompt_ids, params, request_id)

    async def generate_stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> AsyncIterator[GenerationChunk]:
        self.replies.append(REPLY)
        whole = await super().generate(prompt_ids, params, request_id)
        ids, logprobs = whole.token_ids, whole.logprobs
        yield GenerationChunk(ids[:2], logprobs[:2], [], None, engine_url=self.url)
        await self._pass(session_id)
        yield GenerationChunk(ids[2:], logprobs[2:], [], whole.finish_reason, engine_url=self.url)


def gated_app(
    max_in_flight: int, settings: Settings | None = None
) -> tuple[Any, GatedEngine, RecordingPublisher]:
    options = ServiceOptions(max_model_len=4096, default_max_tokens=32, max_in_flight=max_in_flight)
    app, engine, publisher = scripted_app([], ROUTERS, settings, options, GatedEngine)
    assert isinstance(engine, GatedEngine)
    return app, engine, publisher


def turn(session: str, *messages: tuple[str, str]) -> ChatTurn:
    history = messages or (("user", "hi"),)
    return ChatTurn(
        session=SessionRef(session_id=session),
        api="openai.chat",
        model="m",
        messages=tuple(Message(role=role, content=text) for role, text in history),
    )


def stepped(publisher: RecordingPublisher) -> list[str]:
    return sorted(e.session_id for e in publisher.events if isinstance(e, StepRecorded))


def refusals(reason: str) -> float:
    value = REGISTRY.get_sample_value("titoflow_ingress_refusals_total", {"reason": reason})
    return value or 0.0


# --- the plain classes --------------------------------------------------------------------------


def test_in_flight_refuses_beyond_its_bound_and_a_slot_frees_once() -> None:
    bound = InFlight(2, retry_after_s=3)
    first, second = bound.acquire(), bound.acquire()
    with pytest.raises(Overloaded) as refused:
        bound.acquire()
    assert (refused.value.what, refused.value.retry_after_s) == ("replica", 3)
    assert refused.value.reason == "overloaded_replica"
    first.release()
    first.release()  # a second release of the same slot frees nothing more
    assert bound.count == 1
    third = bound.acquire()
    with pytest.raises(Overloaded):
        bound.acquire()
    second.release()
    third.release()
    assert bound.count == 0
    unbounded = InFlight(0)
    assert [unbounded.acquire() for _ in range(1000)] and unbounded.count == 1000


def test_budgets_read_what_a_call_used_from_the_call() -> None:
    budgets = SessionBudgets(kept=2)
    opened = 1000.0
    budget = SessionBudget(turns=3, tokens=100, wall_s=60)
    budgets.record(SessionBudgeted(session_id="s", event_time=opened, budget=budget))
    budgets.check("s", lambda: 3, opened + 59)  # the third turn, within the minute
    with pytest.raises(SessionBudgetExceeded) as turns:
        budgets.check("s", lambda: 4, opened + 1)
    assert (turns.value.budget, turns.value.limit, turns.value.used) == ("turns", 3, 3)
    assert turns.value.param == "budget.turns" and turns.value.reason == "budget_turns"
    with pytest.raises(SessionBudgetExceeded, match="wall-time budget of 60 s") as wall:
        budgets.check("s", lambda: 1, opened + 61)
    assert wall.value.details() == {"budget": {"name": "wall_s", "limit": 60, "used": 61.0}}
    assert budgets.max_tokens("s", 64, 10) == 64
    assert budgets.max_tokens("s", 64, 90) == 10  # clamped to the trajectory's budget
    with pytest.raises(SessionBudgetExceeded, match="budget of 100 tokens: the prompt has 100"):
        budgets.max_tokens("s", 64, 100)
    budgets.check("other", lambda: pytest.fail("counted"), 10**12)  # no budget: not counted
    assert budgets.max_tokens("other", 64, 10**6) == 64
    for name in ("a", "b"):  # bounded: the oldest budget goes first
        budgets.record(SessionBudgeted(session_id=name, event_time=opened, budget=budget))
    assert budgets.get("s") is None and budgets.get("b") is not None


# --- in flight: every path frees its slot (a property over random fates) ---------------------

FATES = ("ok", "fail", "cancel", "stream", "stream_cancel", "stream_closed", "stream_dropped")


async def _run_fates(fates: list[str], limit: int) -> None:
    app, engine, publisher = gated_app(limit)
    service: ChatService = app.state.service
    bound = service.admission.in_flight
    refused: list[str] = []

    async def call(session: str, fate: str) -> None:
        if fate == "fail":
            engine.failing.add(session)
        try:
            if not fate.startswith("stream"):
                await service.complete(turn(session))
                return
            _, events = await service.open_stream(turn(session))
            if fate == "stream_dropped":  # the client left before the first event
                del events
                return
            first = await anext(events)
            assert isinstance(first.event, TokensSampled)
            if fate == "stream_closed":  # the client left after it (the server closes it)
                await events.aclose()  # type: ignore[attr-defined]
                return
            async for _ in events:
                pass
        except Overloaded:
            refused.append(session)
        except EngineError:
            assert fate == "fail"

    tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}
    expected_refused, held = [], 0
    for i, fate in enumerate(fates):
        session = f"s{i}-{fate}"
        at_gate = engine.waiting
        task = asyncio.create_task(call(session, fate))
        tasks[session] = (fate, task)
        async with asyncio.timeout(10):  # until it waits at the engine, or is over
            while not (task.done() or engine.waiting > at_gate):
                await asyncio.sleep(0)
        if held >= limit:
            expected_refused.append(session)
        elif fate not in ("stream_dropped", "stream_closed"):  # those left at once
            held += 1
        assert bound.count == held <= limit
    assert sorted(refused) == sorted(expected_refused)
    for session, (fate, task) in tasks.items():
        if fate in ("cancel", "stream_cancel") and session not in refused:
            task.cancel()  # the client left while the engine was generating
    engine.gate.set()
    await asyncio.gather(*(task for _, task in tasks.values()), return_exceptions=True)
    assert bound.count == 0
    completed = [
        s for s, (fate, _) in tasks.items() if fate in ("ok", "stream") and s not in refused
    ]
    assert stepped(publisher) == sorted(completed)  # nothing of a refused or broken call
    await service.complete(turn("after"))  # the bound is free again


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fates=st.lists(st.sampled_from(FATES), min_size=1, max_size=8), limit=st.integers(1, 4))
def test_every_call_frees_its_slot_whatever_its_fate(fates: list[str], limit: int) -> None:
    asyncio.run(_run_fates(fates, limit))


async def test_the_engines_bound_is_reserved_at_admission_before_any_engine_is_picked() -> None:
    """Two streams admitted before either reached the pool cannot both pass: the second is
    refused by open_stream (the adapter's 429), not by an error event after its 200."""
    stub = StubEngine("http://a")
    pool = EnginePool([EngineSpec(stub.url)], lambda _: stub, in_flight_limit=1)
    tokenizer, publisher = qwen3(), RecordingPublisher()
    service = ChatService(
        ChatRenderer(tokenizer),
        tokenizer,
        pool,
        publisher,
        ChainStore(10),
        ServiceOptions(max_model_len=4096, default_max_tokens=8, max_in_flight=10),
        capacity=pool,
    )
    _, first = await service.open_stream(turn("first"))
    with pytest.raises(Overloaded) as refused:
        await service.open_stream(turn("second"))
    assert refused.value.reason == "overloaded_engine"
    assert stub.calls == [] and service.admission.in_flight.count == 1
    assert isinstance([e async for e in first][-1].event, TurnDone)
    assert (pool.reserved, service.admission.in_flight.count) == (0, 0)
    _, second = await service.open_stream(turn("second"))
    del second  # never read: its slot and its reservation go with it
    assert (pool.reserved, service.admission.in_flight.count) == (0, 0)
    bounded = InFlight(1)
    held = bounded.acquire()
    with pytest.raises(Overloaded):  # refused by the replica: the reservation is given back
        bounded.acquire(also=pool.reserve())
    assert pool.reserved == 0
    held.release()
    assert stepped(publisher) == ["first"]


# --- in flight, over HTTP with the official SDKs -------------------------------------------------


async def test_calls_beyond_the_bound_get_a_fast_429_with_retry_after_and_publish_nothing() -> None:
    app, engine, publisher = gated_app(2)
    before = refusals("overloaded_replica")
    clients = {
        f"c{i}": openai.AsyncOpenAI(
            base_url=f"http://ingress/sess/c{i}/v1",
            api_key="k",
            http_client=asgi_client(app),
            max_retries=0,
        )
        for i in range(5)
    }

    async def ask(session: str) -> tuple[str, float]:
        started = time.perf_counter()
        try:
            await clients[session].chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        except openai.RateLimitError as exc:
            assert exc.response.headers["retry-after"] == "1"
            body = exc.response.json()["error"]
            assert (body["type"], body["code"]) == ("rate_limit_exceeded", "overloaded")
            return "refused", time.perf_counter() - started
        return "answered", time.perf_counter() - started

    held = [asyncio.create_task(ask(s)) for s in ("c0", "c1")]
    await until(lambda: _true(engine.waiting == 2), "two generations at the engine", 10)
    # The bound: refused while two generations wait at the engine, each well within 5 s (a
    # generous bound for a refusal made before rendering on a loaded 2-core machine).
    for session in ("c2", "c3", "c4"):
        outcome, took = await ask(session)
        assert outcome == "refused" and took < 5.0
    assert stepped(publisher) == []
    assert refusals("overloaded_replica") - before == 3
    engine.gate.set()
    assert [outcome for outcome, _ in await asyncio.gather(*held)] == ["answered"] * 2
    assert (await ask("c2"))[0] == "answered"  # the bound freed up
    assert stepped(publisher) == ["c0", "c1", "c2"]


async def _true(value: bool) -> bool:
    return value


async def test_anthropic_clients_get_429_rate_limit_error_with_retry_after() -> None:
    app, engine, publisher = gated_app(1)
    held = asyncio.create_task(
        openai.AsyncOpenAI(
            base_url="http://ingress/sess/h/v1", api_key="k", http_client=asgi_client(app)
        ).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    )
    await until(lambda: _true(engine.waiting == 1), "one generation at the engine", 10)
    sdk = anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/a", api_key="k", http_client=asgi_client(app), max_retries=0
    )
    for stream in (False, True):
        with pytest.raises(anthropic.RateLimitError) as refused:
            await sdk.messages.create(
                model="m",
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
                stream=stream,
            )
        assert refused.value.status_code == 429
        assert refused.value.response.headers["retry-after"] == "1"
        body = refused.value.body
        assert isinstance(body, dict) and body["error"]["type"] == "rate_limit_error"
    engine.gate.set()
    await held
    assert stepped(publisher) == ["h"]


async def test_a_stream_cut_mid_way_frees_its_slot() -> None:
    """Over real HTTP (uvicorn): the client reads the first chunk and hangs up while the engine
    still generates; the server cancels the stream and its slot is free again."""
    app, engine, publisher = gated_app(1)
    bound = app.state.service.admission.in_flight
    async with serving(app) as url, httpx.AsyncClient(timeout=10) as http:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with http.stream("POST", f"{url}/sess/cut/v1/chat/completions", json=body) as sse:
            assert sse.status_code == 200
            first = await anext(sse.aiter_lines())
            assert first.startswith("data: ")
            assert bound.count == 1
            busy = await http.post(f"{url}/sess/other/v1/chat/completions", json=body)
            assert busy.status_code == 429
        await until(lambda: _true(bound.count == 0), "the cut stream's slot freed", 10)
        engine.gate.set()
        answer = await http.post(f"{url}/sess/other/v1/chat/completions", json=body)
        assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")
    assert bound.count == 0
    assert stepped(publisher) == ["other"]  # the cut stream published nothing


# --- budgets, through the official SDKs ------------------------------------------------------


class CountingClient(httpx2.AsyncClient):
    """The SDKs' transport, counting the requests they send (their retries included)."""

    def __init__(self, app: Any) -> None:
        super().__init__(transport=httpx2.ASGITransport(app=app), base_url="http://ingress")
        self.sent = 0

    async def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        self.sent += 1
        return await super().send(request, **kwargs)


async def open_with(app: Any, session: str, **budget: float) -> None:
    answer = await asgi_client(app).post(
        "/v1/sessions", json={"session_id": session, "budget": budget}
    )
    assert answer.status_code == 200, answer.text


async def test_a_turn_budget_ends_in_a_403_the_openai_sdk_does_not_retry() -> None:
    app, engine, publisher = gated_app(0)
    engine.gate.set()
    await open_with(app, "t", turns=1)
    http = CountingClient(app)
    client = openai.AsyncOpenAI(base_url="http://ingress/sess/t/v1", api_key="k", http_client=http)
    assert client.max_retries == 2  # the SDK's default: it retries 408, 409, 429 and 5xx
    ask: list[Any] = [{"role": "user", "content": "hi"}]
    first = await client.chat.completions.create(model="m", messages=ask)
    again = [*ask, {"role": "assistant", "content": first.choices[0].message.content}]
    again.append({"role": "user", "content": "and now?"})
    sent = http.sent
    for stream in (False, True):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await client.chat.completions.create(model="m", messages=again, stream=stream)
        assert refused.value.response.headers["x-should-retry"] == "false"
        error = refused.value.body
        assert isinstance(error, dict)
        assert (error["type"], error["code"]) == ("permission_error", "session_budget_exceeded")
        assert error["param"] == "budget.turns"
        assert error["budget"] == {"name": "turns", "limit": 1, "used": 1}
        assert "used up its budget of 1 turns" in error["message"]
    assert http.sent == sent + 2  # one request each: not retried
    kinds = [type(e).__name__ for e in publisher.events]
    assert kinds == ["SessionBudgeted", "SessionOpened", "StepRecorded"]
    opened = publisher.events[1]
    assert isinstance(opened, SessionOpened)
    assert opened.budget.model_dump() == {"turns": 1, "tokens": None, "wall_s": None}
    # A new conversation of the same session (a sub-agent) starts at its first turn again.
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "sub"}])


async def test_token_and_wall_budgets_through_the_anthropic_sdk() -> None:
    app, engine, publisher = gated_app(0)
    engine.gate.set()
    service: ChatService = app.state.service
    ask: list[Any] = [{"role": "user", "content": "hi"}]
    free = anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/free", api_key="k", http_client=asgi_client(app)
    )
    whole = await free.messages.create(model="m", max_tokens=32, messages=ask)
    prompt = whole.usage.input_tokens
    assert whole.usage.output_tokens > 2

    await open_with(app, "tok", tokens=prompt + 2)
    http = CountingClient(app)
    sdk = anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/tok", api_key="k", http_client=http
    )
    clamped = await sdk.messages.create(model="m", max_tokens=32, messages=ask)
    assert (clamped.usage.output_tokens, clamped.stop_reason) == (2, "max_tokens")
    longer = [*ask, {"role": "assistant", "content": "Fine"}, {"role": "user", "content": "go"}]
    sent = http.sent
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        await sdk.messages.create(model="m", max_tokens=32, messages=longer)
    assert http.sent == sent + 1  # the anthropic SDK does not retry a 403 either
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "permission_error"
    assert f"used up its budget of {prompt + 2} tokens" in body["error"]["message"]

    await open_with(app, "wall", wall_s=30)
    budgeted = service.budgets.get("wall")
    assert budgeted is not None
    walled = anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/wall", api_key="k", http_client=asgi_client(app)
    )
    await walled.messages.create(model="m", max_tokens=8, messages=ask)
    service.budgets.record(budgeted.model_copy(update={"event_time": time.time() - 31}))
    with pytest.raises(anthropic.PermissionDeniedError, match="wall-time budget of 30 s"):
        await walled.messages.create(model="m", max_tokens=8, messages=ask, stream=True)
    assert stepped(publisher) == ["free", "tok", "wall"]


@pytest.mark.parametrize(
    ("budget", "words"),
    [
        ({"turns": 0}, "greater than or equal to 1"),
        ({"tokens": -5}, "greater than or equal to 1"),
        ({"wall_s": 0}, "greater than 0"),
        ({"turn": 3}, "budget.turn"),
    ],
)
async def test_a_bad_budget_is_a_400_and_opens_nothing(budget: dict[str, Any], words: str) -> None:
    app, _, publisher = gated_app(0)
    answer = await asgi_client(app).post("/v1/sessions", json={"budget": budget})
    assert answer.status_code == 400, answer.text
    assert words in answer.text
    assert publisher.events == []


# --- a budget on every replica ------------------------------------------------------------------


async def test_a_budget_set_on_one_replica_holds_on_another(settings: Settings) -> None:
    """Two ingress apps on the real broker (tansu): the session opens on one with a budget of one
    turn; the other, which never saw the open, refuses its second turn. The engine is the
    scripted double (swapped into each app's runner): the budget's path is the broker's."""
    first, second = create_app(settings), create_app(settings)
    async with serving(first) as one, serving(second) as two:
        for app in (first, second):
            service: ChatService = app.state.service
            engine = ScriptedEngine(qwen3(), [REPLY] * 4)
            service.runner = replace(service.runner, engine=engine)
        async with RolloutClient(one, settings) as driver:
            await driver.open(session_id="moved", budget={"turns": 1})
            budgets: SessionBudgets = second.state.service.budgets
            await until(lambda: _true(budgets.get("moved") is not None), "the budget followed")
            client = openai.AsyncOpenAI(base_url=f"{two}/sess/moved/v1", api_key="k")
            ask: list[Any] = [{"role": "user", "content": "hi"}]
            answer = await client.chat.completions.create(model="m", messages=ask)
            ask += [{"role": "assistant", "content": answer.choices[0].message.content}]
            ask += [{"role": "user", "content": "more"}]
            with pytest.raises(openai.PermissionDeniedError, match="budget of 1 turns"):
                await client.chat.completions.create(model="m", messages=ask)
            await client.close()

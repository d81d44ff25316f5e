"""The sampling record and the rollout driver's overrides (issue 27, parts 1 and 2): the plain
functions that resolve and record them; the overrides set at open as the openai SDK (chat,
streamed and not; Responses), the anthropic SDK and the token API see them on the SCRIPTED
ENGINE DOUBLE, each step recording what was asked and what the engine was sent; a bad override
refused with nothing opened; the overrides on a second replica, through the real broker; the
record reaching the segment's steps. On the real engine: tests/e2e/test_e2e_openai.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingress.app import create_app
from ingress.turns import sampling
from ingress.turns.admission import Admission
from ingress.turns.budgets import SessionBudgets
from ingress.turns.ended_sessions import EndedSessions
from ingress.turns.service import ChatService, ServiceOptions
from ingress.turns.turn import ChatTurn, SamplingOptions, SessionRef, TokenCall
from ingress.wire import (
    anthropic_messages,
    openai_chat,
    openai_responses,
    session_routes,
    token_api,
)
from schemas.events import (
    SamplingAsked,
    SamplingOverrides,
    SessionBudget,
    SessionBudgeted,
    SessionOpened,
    StepRecorded,
)
from tests.support.apps import asgi_client, scripted_app, serving, until
from tests.support.doubles import ScriptedEngine
from tests.support.factories import assemble
from tests.support.factories import recorded_step as step
from tests.support.families import qwen3
from titoflow.client.rollout import RolloutClient
from titoflow.engine.api import GenerateParams
from titoflow.errors import ContextOverflow
from titoflow.settings import Settings

REPLY = "Fine, thanks.<|im_end|>"
ROUTERS = [
    openai_chat.router,
    anthropic_messages.router,
    openai_responses.router,
    token_api.router,
    session_routes.router,
    session_routes.driver_router,
]
ASK: list[Any] = [{"role": "user", "content": "hi"}]


def witnessed_app(
    calls: int, options: ServiceOptions | None = None
) -> tuple[Any, ScriptedEngine, list[Any]]:
    """An app on the scripted double, which keeps the parameters of every call it was sent."""
    app, engine, publisher = scripted_app([REPLY] * calls, ROUTERS, options=options)
    return app, engine, publisher.events


def as_sent(params: GenerateParams) -> dict[str, Any]:
    """What a step's record must say of the call the engine got."""
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "seed": params.seed,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "max_tokens": params.max_tokens,
        "constrained": params.structured is not None,
    }


def recorded(step: StepRecorded) -> dict[str, Any]:
    assert step.sampling is not None
    neutral = {"min_p", "repetition_penalty", "logprobs_mode"}
    return step.sampling.model_dump(exclude=neutral)


def steps(events: list[Any]) -> list[StepRecorded]:
    return [e for e in events if isinstance(e, StepRecorded)]


async def open_session(app: Any, session: str, **overrides: Any) -> Any:
    return await asgi_client(app).post(
        "/v1/sessions", json={"session_id": session, "sampling": overrides}
    )


# --- the plain functions -------------------------------------------------------------------------

PARAMS = GenerateParams(max_tokens=32, temperature=0.2, top_p=0.5, seed=7, stop=("END",))


def test_no_overrides_leave_the_call_as_it_is() -> None:
    assert sampling.overridden(PARAMS, SamplingOverrides(), "step") is PARAMS
    assert not SamplingOverrides()
    assert SamplingOverrides(top_p=1.0)
    assert not session_routes.OpenSessionBody().sampling  # the open route's own (strict) kind


def test_a_fixed_seed_and_a_per_step_seed() -> None:
    fixed = sampling.overridden(PARAMS, SamplingOverrides(seed=3), "a")
    assert fixed == replace(PARAMS, seed=3)
    per_step = SamplingOverrides(seed=3, seed_policy="per_step")
    a, b = (sampling.overridden(PARAMS, per_step, s).seed for s in ("a", "b"))
    assert a == sampling.step_seed(3, "a") == sampling.overridden(PARAMS, per_step, "a").seed
    assert a != b and a is not None and 0 <= a < 2**31
    assert sampling.step_seed(4, "a") != a  # the base matters
    # Without a base the per-step seeds derive from 0; the scaffold's seed never stands.
    unbased = sampling.overridden(PARAMS, SamplingOverrides(seed_policy="per_step"), "a")
    assert unbased.seed == sampling.step_seed(0, "a")


@given(
    temperature=st.none() | st.floats(0.0, 2.0),
    top_p=st.none() | st.floats(0.01, 1.0),
    top_k=st.none() | st.sampled_from([-1, 1, 40]),
    seed=st.none() | st.integers(0, 2**40),
)
def test_every_override_set_wins_and_every_other_value_stands(
    temperature: float | None, top_p: float | None, top_k: int | None, seed: int | None
) -> None:
    overrides = SamplingOverrides(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    used = sampling.overridden(PARAMS, overrides, "s")
    assert used.temperature == (PARAMS.temperature if temperature is None else temperature)
    assert used.top_p == (PARAMS.top_p if top_p is None else top_p)
    assert used.top_k == (PARAMS.top_k if top_k is None else top_k)
    assert used.seed == (PARAMS.seed if seed is None else seed)
    assert (used.max_tokens, used.stop, used.stop_token_ids) == (32, ("END",), ())


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"top_k": 0}, "top_k 0 is ambiguous"),
        ({"seed_policy": "fixed"}, "seed_policy fixed needs a seed"),
        ({"temperature": -0.5}, "greater than or equal to 0"),
        ({"top_p": 0}, "greater than 0"),
        ({"max_tokens": 0}, "greater than or equal to 1"),
        ({"seed": -1}, "greater than or equal to 0"),
        ({"seed_policy": "random"}, "'fixed' or 'per_step'"),
    ],
)
def test_incoherent_overrides_are_refused(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SamplingOverrides.model_validate(overrides)


def test_the_record_reads_the_call_sent_and_the_call_asked() -> None:
    forced = replace(PARAMS, top_k=5, structured={"structured_outputs": {}})
    used = sampling.used(forced, "processed_logprobs")
    assert used.model_dump() == {
        "temperature": 0.2,
        "top_p": 0.5,
        "top_k": 5,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "seed": 7,
        "stop": ["END"],
        "stop_token_ids": [],
        "max_tokens": 32,
        "constrained": True,
        "logprobs_mode": "processed_logprobs",
    }
    ref = SessionRef(session_id="s")
    turn = ChatTurn(
        session=ref,
        api="anthropic.messages",
        model="m",
        messages=(),
        sampling=SamplingOptions(max_tokens=9, temperature=0.3, top_k=4, stop=("x",)),
    )
    assert sampling.asked(turn) == SamplingAsked(
        temperature=0.3, top_p=1.0, top_k=4, max_tokens=9, stop=["x"]
    )
    call = TokenCall(session=ref, model="m", prompt_ids=(1,), temperature=0.5, top_k=3, seed=2)
    assert sampling.asked(call) == SamplingAsked(temperature=0.5, top_p=1.0, top_k=3, seed=2)


def test_the_drivers_cap_comes_before_the_context_check() -> None:
    budgets = SessionBudgets(kept=4)
    capped = SamplingOverrides(max_tokens=8)
    budgets.record(
        SessionBudgeted(session_id="s", event_time=0.0, budget=SessionBudget(), sampling=capped)
    )
    options = ServiceOptions(max_model_len=100, default_max_tokens=64, context_policy="refuse")
    admission = Admission(options, None, EndedSessions(kept=4), budgets)
    assert admission.max_tokens(64, 90, "s") == 8  # 8 fit where 64 would not
    assert admission.max_tokens(None, 10, "s") == 8  # the default is capped too
    with pytest.raises(ContextOverflow):
        admission.max_tokens(64, 90, "other")


def test_segments_carry_each_steps_record() -> None:
    used = sampling.used(PARAMS, "raw_logprobs")
    asked = SamplingAsked(temperature=0.7, top_p=0.9)
    first = step("a", [1, 2], [10], sampling=used, sampling_asked=asked)
    second = step("b", [3], [11], parent="a", prefix_len=3)  # from an older titoflow: none
    [segment] = assemble([first, second])
    assert [(s.sampling, s.sampling_asked) for s in segment.steps] == [
        (used, asked),
        (None, None),
    ]


# --- through the SDKs ----------------------------------------------------------------------------


async def test_overrides_win_over_the_openai_sdk_and_both_are_recorded() -> None:
    app, engine, events = witnessed_app(2)
    overrides = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 16}
    opened = await open_session(app, "o", **overrides, seed=123, seed_policy="per_step")
    assert opened.status_code == 200, opened.text
    client = openai.AsyncOpenAI(
        base_url="http://ingress/sess/o/v1", api_key="k", http_client=asgi_client(app)
    )
    for stream in (False, True):
        answer = await client.chat.completions.create(
            model="m",
            messages=ASK,
            stream=stream,
            temperature=0.2,
            top_p=0.5,
            seed=7,
            max_tokens=40,
            stop=["END"],
        )
        if isinstance(answer, openai.AsyncStream):
            [_ async for _ in answer]
    done = steps(events)
    assert len(done) == len(engine.params) == 2
    for sent, made in zip(engine.params, done, strict=True):
        assert recorded(made) == as_sent(sent)
        assert (sent.temperature, sent.top_p, sent.max_tokens) == (1.0, 1.0, 16)
        assert sent.seed == sampling.step_seed(123, made.step_id)
        assert sent.stop == ("END",)  # what the driver did not override stands
        assert made.sampling_asked == SamplingAsked(
            temperature=0.2, top_p=0.5, seed=7, max_tokens=40, stop=["END"]
        )
        assert made.sampling is not None and made.sampling.logprobs_mode == "raw_logprobs"
    assert done[0].sampling != done[1].sampling  # per step: two seeds
    [opening] = [e for e in events if isinstance(e, SessionOpened)]
    assert opening.sampling.seed_policy == "per_step"


async def test_overrides_win_over_the_anthropic_sdk() -> None:
    app, engine, events = witnessed_app(1)
    assert (await open_session(app, "a", temperature=1.0, top_k=-1, seed=9)).status_code == 200
    client = anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/a", api_key="k", http_client=asgi_client(app)
    )
    # This SDK's create() no longer names temperature and top_k (scaffolds still send them).
    asked = {"temperature": 0.3, "top_k": 5}
    await client.messages.create(model="m", max_tokens=32, messages=ASK, extra_body=asked)
    [sent], [made] = engine.params, steps(events)
    assert (sent.temperature, sent.top_k, sent.seed, sent.max_tokens) == (1.0, -1, 9, 32)
    assert recorded(made) == as_sent(sent)
    assert made.sampling_asked == SamplingAsked(temperature=0.3, top_p=1.0, top_k=5, max_tokens=32)


async def test_overrides_win_over_the_responses_api_and_the_token_api() -> None:
    app, engine, events = witnessed_app(2)
    assert (await open_session(app, "r", temperature=1.0, max_tokens=8)).status_code == 200
    client = openai.AsyncOpenAI(
        base_url="http://ingress/sess/r/v1", api_key="k", http_client=asgi_client(app)
    )
    await client.responses.create(model="m", input="hi", temperature=0.1, max_output_tokens=30)
    answer = await asgi_client(app).post(
        "/sess/r/generate",
        json={
            "input_ids": [1, 2, 3],
            "sampling_params": {"temperature": 0.5, "top_k": 3, "seed": 4},
        },
    )
    assert answer.status_code == 200, answer.text
    made = steps(events)
    assert [s.api for s in made] == ["openai.responses", "generate"]
    assert [(p.temperature, p.max_tokens) for p in engine.params] == [(1.0, 8), (1.0, 8)]
    assert (engine.params[1].seed, engine.params[1].top_k) == (4, 3)  # not overridden: they stand
    for sent, step_made in zip(engine.params, made, strict=True):
        assert recorded(step_made) == as_sent(sent)
    assert [s.sampling_asked for s in made] == [
        SamplingAsked(temperature=0.1, top_p=1.0, max_tokens=30),
        SamplingAsked(temperature=0.5, top_p=1.0, top_k=3, seed=4),
    ]


async def test_without_overrides_the_record_is_what_was_asked_and_the_engines_mode() -> None:
    options = ServiceOptions(
        max_model_len=4096, default_max_tokens=64, logprobs_mode="processed_logprobs"
    )
    app, engine, events = witnessed_app(1, options)
    client = openai.AsyncOpenAI(
        base_url="http://ingress/sess/plain/v1", api_key="k", http_client=asgi_client(app)
    )
    await client.chat.completions.create(model="m", messages=ASK, temperature=0.6, seed=1)
    [sent], [made] = engine.params, steps(events)
    assert recorded(made) == as_sent(sent)
    assert (sent.temperature, sent.seed, sent.max_tokens) == (0.6, 1, 64)  # 64: the default
    assert made.sampling is not None and made.sampling.logprobs_mode == "processed_logprobs"
    assert made.sampling_asked == SamplingAsked(temperature=0.6, top_p=1.0, seed=1)
    assert [type(e).__name__ for e in events] == ["StepRecorded"]  # nothing else per turn


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"top_k": 0}, "top_k 0 is ambiguous"),
        ({"temperature": -1}, "greater than or equal to 0"),
        ({"seed_policy": "fixed"}, "needs a seed"),
        ({"tempreature": 1.0}, "sampling.tempreature"),
    ],
)
async def test_a_bad_override_is_a_400_and_opens_nothing(
    overrides: dict[str, Any], words: str
) -> None:
    app, _, events = witnessed_app(0)
    answer = await open_session(app, "bad", **overrides)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"]
    assert events == []
    assert app.state.service.budgets.get("bad") is None


# --- on every replica ----------------------------------------------------------------------------


async def test_overrides_set_on_one_replica_hold_on_another(settings: Settings) -> None:
    """Two ingress apps on the real broker (tansu): the session opens on one with overrides; the
    other, which never saw the open, sends the engine the driver's sampling."""
    first, second = create_app(settings), create_app(settings)
    async with serving(first) as one, serving(second) as two:
        engines = []
        for app in (first, second):
            service: ChatService = app.state.service
            engines.append(ScriptedEngine(qwen3(), [REPLY] * 2))
            service.runner = replace(service.runner, engine=engines[-1])
        async with RolloutClient(one, settings) as driver:
            await driver.open(session_id="moved", sampling={"temperature": 1.0, "seed": 5})
            budgets: SessionBudgets = second.state.service.budgets
            await until(lambda: _true(budgets.overrides("moved") is not None), "overrides")
            client = openai.AsyncOpenAI(base_url=f"{two}/sess/moved/v1", api_key="k")
            await client.chat.completions.create(model="m", messages=ASK, temperature=0.2)
            await client.close()
    assert engines[0].params == []
    [sent] = engines[1].params
    assert (sent.temperature, sent.seed) == (1.0, 5)


async def _true(value: bool) -> bool:
    await asyncio.sleep(0)
    return value

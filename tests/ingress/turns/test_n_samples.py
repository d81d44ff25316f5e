"""OpenAI chat's ``n`` through the official SDK, in-process on the SCRIPTED ENGINE DOUBLE: ``n``
samples of one prompt are ``n`` engine calls and ``n`` sibling steps (own step ids, own tool-call
ids, one parent, one prompt), answered as ``n`` choices, streamed or not; the one the client
continues is the used branch and the others are unused samples, each step in exactly one
segment (the Assembler, as a worker runs it). A failed sample records none. The same on the real
engine, witnessed: tests/e2e/test_e2e_samples.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import openai
import pytest

from ingress.turns.admission import InFlight
from ingress.turns.chains import MAX_CHAINS_PER_SESSION
from ingress.turns.service import SampleEvent, ServiceOptions
from ingress.turns.turn import ChatTurn, SessionRef
from ingress.wire import openai_chat, session_routes
from schemas.events import SegmentFinalized, StepRecorded
from tests.support.apps import asgi_client, echoed_choices, scripted_app
from tests.support.doubles import ScriptedEngine, StubEngine
from tests.support.families import path_tool
from titoflow.engine.api import GenerateParams, Generation
from titoflow.engine.pool import EnginePool, EngineSpec
from titoflow.errors import EngineUnavailable, Overloaded
from titoflow.tito.messages import Message
from workers.assembler import Assembler

TOOLS: Any = [path_tool("ls", "list a directory")]
CALL = '<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp"}}\n</tool_call><|im_end|>'
ROUTERS = [openai_chat.router, session_routes.router, session_routes.driver_router]
N = 4
CONTINUED = 2  # the choice the client goes on with


def client_for(app: Any, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://ingress/sess/{session}/v1",
        api_key="unused",
        http_client=asgi_client(app),
        max_retries=0,
    )


def steps_of(publisher: Any) -> list[StepRecorded]:
    return [e for e in publisher.events if isinstance(e, StepRecorded)]


def assemble(steps: Sequence[StepRecorded], session: str) -> list[SegmentFinalized]:
    assembler = Assembler()
    for offset, step in enumerate(steps):
        assembler.add_step(step, partition=0, offset=offset)
    return assembler.finalize(session, "finalized", {"reward": 1.0})


def call_ids(step: StepRecorded) -> list[str]:
    return [c["id"] for c in step.response_message.get("tool_calls", [])]


async def _choices(client: openai.AsyncOpenAI, stream: bool, **request: Any) -> list[Any]:
    """The ``n`` assistant messages as the client echoes them back, by choice index; the answer
    reports its usage, whole or streamed."""
    messages, usage = await echoed_choices(client, N, stream, **request)
    assert usage is not None and usage.completion_tokens > 0
    return messages


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_n_samples_are_siblings_and_the_continued_one_is_the_used_branch(
    stream: bool,
) -> None:
    # The n samples sample the same tool call: only their ids tell them apart.
    replies = [CALL, *[CALL] * N, "Done.<|im_end|>"]
    app, engine, publisher = scripted_app(replies, ROUTERS)
    session = f"n-{stream}"
    client = client_for(app, session)
    messages: list[Any] = [{"role": "user", "content": "what is in /tmp?"}]
    first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    [first_call] = first.choices[0].message.tool_calls or []
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [first_call.model_dump()]},
        {"role": "tool", "tool_call_id": first_call.id, "content": "a.txt"},
    ]
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    answers = await _choices(client, stream, model="m", messages=messages, tools=TOOLS, **extra)
    chosen = answers[CONTINUED]
    messages += [
        chosen,
        {"role": "tool", "tool_call_id": chosen["tool_calls"][0]["id"], "content": "b"},
    ]
    await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)

    head, *samples, after = steps_of(publisher)
    assert len(samples) == N and len(engine.prompts) == N + 2  # one engine call per sample
    # Siblings: one parent, one prompt (the same tokens sent to the engine), a step id each.
    assert {s.parent_step_id for s in samples} == {head.step_id}
    assert {(s.prefix, s.prefix_len, tuple(s.prompt_tail_ids)) for s in samples} == {
        ("tito", samples[0].prefix_len, tuple(samples[0].prompt_tail_ids))
    }
    assert all(p == engine.prompts[1] for p in engine.prompts[1 : N + 1])
    assert len({s.step_id for s in samples}) == N
    assert {s.stream for s in samples} == {stream}
    ids = [i for s in samples for i in call_ids(s)]
    assert len(set(ids)) == len(ids) == N, "two samples share a tool-call id"
    # Choice i is sample i's step, and the client continued exactly that one.
    assert [a["tool_calls"][0]["id"] for a in answers] == [call_ids(s)[0] for s in samples]
    assert after.parent_step_id == samples[CONTINUED].step_id and after.prefix == "tito"

    segments = assemble(steps_of(publisher), session)
    trained = Counter(
        entry.step_id
        for segment in segments
        for entry in segment.steps
        if any(segment.loss_mask[entry.completion_start : entry.completion_end])
    )
    assert trained == Counter(s.step_id for s in steps_of(publisher)), "a step not trained once"
    unused = {e.step_id for s in segments if s.unused_sample for e in s.steps[-1:]}
    assert unused == {s.step_id for i, s in enumerate(samples) if i != CONTINUED}
    [branch] = [s for s in segments if s.last_of_session]
    assert not branch.unused_sample
    assert [e.step_id for e in branch.steps][-2:] == [samples[CONTINUED].step_id, after.step_id]


async def test_n_samples_of_a_first_prompt_are_rendered_siblings_and_the_chains_stay_bounded() -> (
    None
):
    replies = [f"Answer {i}.<|im_end|>" for i in range(N)] * 5
    app, _, publisher = scripted_app(replies, ROUTERS)
    client = client_for(app, "first")
    messages: Any = [{"role": "user", "content": "hi"}]
    answer = await client.chat.completions.create(model="m", messages=messages, n=N, logprobs=True)
    assert [c.message.content for c in answer.choices] == [f"Answer {i}." for i in range(N)]
    samples = steps_of(publisher)
    assert answer.id == f"chatcmpl-{samples[0].step_id}"
    for choice, sample in zip(answer.choices, samples, strict=True):  # each choice its own
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert [e.logprob for e in choice.logprobs.content] == sample.completion_logprobs
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(samples[0].prompt_tail_ids)  # the prompt once
    assert answer.usage.completion_tokens == sum(len(s.completion_ids) for s in samples)
    assert {(s.prefix, s.parent_step_id) for s in samples} == {("rendered", None)}
    assert len({s.step_id for s in samples}) == N
    service = app.state.service
    assert len(service.chains._sessions["first"]) == N  # each sample a tip the client may continue
    for _ in range(4):  # more samples than a session keeps chains: the oldest tips leave
        await client.chat.completions.create(model="m", messages=messages, n=N)
    assert len(service.chains._sessions["first"]) == MAX_CHAINS_PER_SESSION


class FailingThirdCall(ScriptedEngine):
    """The scripted double, with its third generation failing (an engine gone mid-request)."""

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerateParams,
        request_id: str,
        session_id: str = "",
    ) -> Generation:
        if len(self.prompts) == 2:
            self.prompts.append(list(prompt_ids))
            raise EngineUnavailable("engine gone (scripted)")
        return await super().generate(prompt_ids, params, request_id, session_id)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_failed_sample_records_none_and_the_client_gets_the_error(stream: bool) -> None:
    replies = ["Fine.<|im_end|>"] * (2 * N)
    app, _, publisher = scripted_app(replies, ROUTERS, engine_type=FailingThirdCall)
    client = client_for(app, "failing")
    messages: Any = [{"role": "user", "content": "hi"}]
    if stream:
        chunks = await client.chat.completions.create(
            model="m", messages=messages, n=N, stream=True
        )
        with pytest.raises(openai.APIError):
            async for _ in chunks:
                pass
    else:
        with pytest.raises(openai.APIStatusError) as failure:
            await client.chat.completions.create(model="m", messages=messages, n=N)
        assert failure.value.status_code == 503
    assert steps_of(publisher) == []
    assert "failing" not in app.state.service.chains._sessions
    again = await client.chat.completions.create(model="m", messages=messages, n=N)
    assert len(again.choices) == N and len(steps_of(publisher)) == N


async def test_n_beyond_what_a_session_keeps_is_a_400_naming_n() -> None:
    app, _, publisher = scripted_app([], ROUTERS)
    client = client_for(app, "big")
    with pytest.raises(openai.BadRequestError) as failure:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], n=MAX_CHAINS_PER_SESSION + 1
        )
    assert failure.value.body["param"] == "n"  # type: ignore[index]
    assert publisher.events == []


async def test_the_samples_take_n_places_in_flight_and_on_the_engines() -> None:
    options = ServiceOptions(max_model_len=4096, default_max_tokens=8, max_in_flight=3)
    app, _, publisher = scripted_app(["Hi.<|im_end|>"] * 8, ROUTERS, options=options)
    client = client_for(app, "places")
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as failure:  # no retry could ever pass
        await client.chat.completions.create(model="m", messages=messages, n=N)
    assert failure.value.body["param"] == "n"  # type: ignore[index]
    service = app.state.service
    assert service.admission.in_flight.count == 0 and publisher.events == []
    answer = await client.chat.completions.create(model="m", messages=messages, n=3)
    assert len(answer.choices) == 3 and service.admission.in_flight.count == 0
    # The engines' bound: places reserved for some samples are given back when one is refused.
    pool = EnginePool([EngineSpec("http://a")], lambda _: StubEngine("http://a"), in_flight_limit=3)
    admission = replace(service.admission, engines=pool, in_flight=InFlight(0))
    with pytest.raises(Overloaded):
        admission.enter("places", lambda: 1, samples=N)
    assert pool.reserved == 0
    slot = admission.enter("places", lambda: 1, samples=3)
    assert pool.reserved == 3 and admission.in_flight.count == 3
    slot.release()
    slot.release()  # once only
    assert pool.reserved == 0 and admission.in_flight.count == 0


async def test_a_failed_publish_records_no_sample_and_advances_no_chain() -> None:
    app, _, publisher = scripted_app(["Hi.<|im_end|>"] * 8, ROUTERS)
    client = client_for(app, "unpublished")
    messages: Any = [{"role": "user", "content": "hi"}]
    publisher.fail_next = True  # the broker refuses the samples' batch
    with pytest.raises(openai.APIStatusError) as failure:
        await client.chat.completions.create(model="m", messages=messages, n=N)
    assert failure.value.status_code == 503
    # One batch: none recorded. No chain advanced: a retry samples the same prompt anew.
    assert steps_of(publisher) == []
    assert "unpublished" not in app.state.service.chains._sessions
    await client.chat.completions.create(model="m", messages=messages)
    assert [s.parent_step_id for s in steps_of(publisher)] == [None]


async def test_a_service_that_cannot_record_samples_together_refuses_n_before_the_engine() -> None:
    app, engine, publisher = scripted_app(["Hi.<|im_end|>"] * 8, ROUTERS)
    service = app.state.service
    service.records_samples = False  # as a service built without publish_together
    client = client_for(app, "unbatched")
    messages: Any = [{"role": "user", "content": "hi"}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as failure:
            await client.chat.completions.create(model="m", messages=messages, n=2, stream=stream)
        assert failure.value.body["param"] == "n"  # type: ignore[index]
    assert engine.prompts == [] and publisher.events == []


async def test_a_client_that_leaves_a_samples_stream_frees_its_places_and_records_nothing() -> None:
    app, _, publisher = scripted_app(["A long enough answer, in a few chunks.<|im_end|>"] * N, [])
    service = app.state.service
    asked = ChatTurn(
        session=SessionRef(session_id="leaver"),
        api="openai.chat",
        model="m",
        messages=(Message(role="user", content="hi"),),
        n=N,
    )
    _, events = await service.open_stream(asked)
    assert service.admission.in_flight.count == N
    first = await anext(events)
    assert isinstance(first, SampleEvent)
    await events.aclose()  # the client went away mid-stream
    assert service.admission.in_flight.count == 0
    assert publisher.events == [] and "leaver" not in service.chains._sessions

"""The OpenAI chat route with the official SDK, in-process on the SCRIPTED ENGINE DOUBLE:
streaming, tools, logprobs, guards, chains and the error-shape table (nothing published on
errors). The same behaviour on the real engine is in tests/e2e/test_e2e_chat.py."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from ingress.turns.service import ServiceOptions
from ingress.wire import openai_chat, session_routes
from ingress.wire.errors import unknown_route_response
from tests.support.apps import asgi_client, scripted_app
from tests.support.families import path_tool, qwen3
from titoflow.settings import Settings

TOOLS: Any = [path_tool("ls", "list a directory")]
CALL = '<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp"}}\n</tool_call><|im_end|>'
ROUTERS = [openai_chat.router, session_routes.router, session_routes.driver_router]


def client_for(app: Any, session: str = "s1") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://ingress/sess/{session}/v1",
        api_key="unused",
        http_client=asgi_client(app),
        max_retries=0,
    )


async def test_streamed_and_whole_answers_are_the_same_message() -> None:
    reply = "<think>\nplan it\n</think>\n\nHello there, friend.<|im_end|>"
    app, _, publisher = scripted_app([reply, reply], ROUTERS)
    client = client_for(app)
    messages: Any = [{"role": "user", "content": "hi"}]
    whole = await client.chat.completions.create(model="m", messages=messages)
    chunks = [
        chunk
        async for chunk in await client.chat.completions.create(
            model="m",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content == "Hello there, friend."
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    assert reasoning == "plan it"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    first, second = publisher.steps()
    assert whole.id == f"chatcmpl-{first.step_id}" and chunks[0].id == f"chatcmpl-{second.step_id}"
    assert (first.stream, second.stream) == (False, True)
    assert len(chunks) > 4  # text arrived in several chunks, not one


async def test_tool_calls_stream_once_complete_and_continue_the_chain() -> None:
    app, _, publisher = scripted_app([CALL, "It has a.txt<|im_end|>"], ROUTERS)
    client = client_for(app)
    messages: list[Any] = [{"role": "user", "content": "what is in /tmp?"}]
    stream = await client.chat.completions.create(
        model="m",
        messages=messages,
        tools=TOOLS,
        stream=True,
    )
    calls = [
        call
        async for chunk in stream
        for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
    ]
    [call] = calls
    assert call.function is not None and call.function.name == "ls"
    assert json.loads(call.function.arguments or "") == {"path": "/tmp"}
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump(exclude={"index"})]},
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
    ]
    answer = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert answer.choices[0].message.content == "It has a.txt"
    first, second = publisher.steps()
    assert second.prefix == "tito" and second.parent_step_id == first.step_id
    assert first.response_message["tool_calls"][0]["id"] == call.id


async def test_logprobs_are_the_engines() -> None:
    app, _, publisher = scripted_app(["one two three<|im_end|>"], ROUTERS)
    answer = await client_for(app).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "count"}],
        logprobs=True,
        top_logprobs=1,
    )
    [step] = publisher.steps()
    assert answer.choices[0].logprobs is not None
    content = answer.choices[0].logprobs.content or []
    assert [entry.logprob for entry in content] == pytest.approx(step.completion_logprobs)
    assert all(len(entry.top_logprobs) == 1 for entry in content)


async def test_tool_choice_none_leaves_tool_text_as_text() -> None:
    app, _, publisher = scripted_app([CALL], ROUTERS)
    answer = await client_for(app).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        tools=TOOLS,
        tool_choice="none",
    )
    assert answer.choices[0].message.tool_calls is None
    assert "<tool_call>" in (answer.choices[0].message.content or "")
    assert publisher.steps()[0].tool_parse_error is None


async def test_sub_agents_sharing_a_session_get_their_own_chains() -> None:
    app, _, publisher = scripted_app(["a1<|im_end|>", "b1<|im_end|>", "a2<|im_end|>"], ROUTERS)
    client = client_for(app)
    main: list[Any] = [{"role": "system", "content": "main"}, {"role": "user", "content": "go"}]
    sub: list[Any] = [
        {"role": "system", "content": "sub-agent"},
        {"role": "user", "content": "dig"},
    ]
    for convo in (main, sub, main):
        if convo[-1]["role"] == "assistant":
            convo.append({"role": "user", "content": "more"})
        reply = await client.chat.completions.create(model="m", messages=convo)
        convo.append({"role": "assistant", "content": reply.choices[0].message.content})
    main_1, sub_1, main_2 = publisher.steps()
    assert sub_1.prefix == "rendered" and sub_1.chain_id != main_1.chain_id
    assert main_2.prefix == "tito" and main_2.parent_step_id == main_1.step_id


async def test_guards_refuse_overflow_and_step_limits_as_typed_400s() -> None:
    options = ServiceOptions(
        max_model_len=64, default_max_tokens=8, context_policy="refuse", max_steps_per_session=1
    )
    app, _, publisher = scripted_app(["ok<|im_end|>"], ROUTERS, options=options)
    client = client_for(app)
    with pytest.raises(openai.BadRequestError) as overflow:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=60
        )
    assert overflow.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):  # refused before the stream commits to a 200
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=60, stream=True
        )
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    first = await client.chat.completions.create(model="m", messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    with pytest.raises(openai.BadRequestError) as limit:
        await client.chat.completions.create(model="m", messages=messages)
    assert limit.value.code == "session_step_limit"
    assert len(publisher.steps()) == 1


GOOD: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("name", "method", "path", "content", "status", "code"),
    [
        ("malformed JSON", "POST", "/sess/s/v1/chat/completions", b"{nope", 400, "invalid_request"),
        (
            "NaN is not JSON",
            "POST",
            "/sess/s/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": NaN}',
            400,
            "invalid_request",
        ),
        (
            "wrong types",
            "POST",
            "/sess/s/v1/chat/completions",
            {**GOOD, "temperature": "hot"},
            400,
            "invalid_request",
        ),
        (
            "empty messages",
            "POST",
            "/sess/s/v1/chat/completions",
            {**GOOD, "messages": []},
            400,
            "invalid_request",
        ),
        (
            "unknown model",
            "POST",
            "/sess/s/v1/chat/completions",
            {**GOOD, "model": "gpt-9"},
            404,
            "model_not_found",
        ),
        ("no session", "POST", "/v1/chat/completions", GOOD, 400, "missing_session"),
        (
            "oversize body",
            "POST",
            "/sess/s/v1/chat/completions",
            {**GOOD, "pad": "x" * 5000},
            413,
            "request_too_large",
        ),
        ("unknown session operation", "POST", "/sess/s/rewind", GOOD, 404, "not_found"),
        ("wrong method", "GET", "/sess/s/v1/chat/completions", None, 400, "invalid_request"),
        ("broker down", "POST", "/sess/s/v1/chat/completions", GOOD, 503, "broker_unavailable"),
    ],
)
async def test_error_table_in_openai_shape_with_nothing_published(
    name: str, method: str, path: str, content: Any, status: int, code: str
) -> None:
    settings = Settings(accepted_models="m", max_request_bytes=4096)
    app, _, publisher = scripted_app(["ok<|im_end|>"], ROUTERS, settings=settings)
    app.add_exception_handler(404, unknown_route_response)
    app.add_exception_handler(405, unknown_route_response)
    publisher.fail_next = name == "broker down"
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    async with asgi_client(app) as http:
        response = await http.request(method, path, content=None if content is None else raw)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["code"] == code
    if status == 503:
        assert response.headers["retry-after"]
    assert publisher.events == []


async def test_discovery_routes() -> None:
    app, _, _ = scripted_app([], ROUTERS)
    async with asgi_client(app) as http:
        assert (await http.head("/sess/abc")).status_code == 200
        assert (await http.get("/sess/abc/v1")).json()["session_id"] == "abc"
        models = (await http.get("/sess/abc/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [Settings().served_model_name]


async def test_stop_strings_end_the_visible_answer_streaming_or_not() -> None:
    reply = "Thought: look\nObservation: made up<|im_end|>"
    app, _, publisher = scripted_app([reply, reply], ROUTERS)
    client = client_for(app)
    request: Any = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    whole = await client.chat.completions.create(**request, stop=["Observation:"])
    stream = await client.chat.completions.create(**request, stop=["Observation:"], stream=True)
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert whole.choices[0].message.content == "Thought: look" == streamed
    # The recorded tokens are all the engine sampled; only the visible answer stops early.
    assert all("Observation" in qwen3().decode(s.completion_ids) for s in publisher.steps())

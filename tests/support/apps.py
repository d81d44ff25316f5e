"""In-process ingress apps on the SCRIPTED ENGINE DOUBLE (tests/support/doubles.py), for fast
adapter
tests with the official SDKs over httpx's ASGI transport. Nothing here replaces the end-to-end
tests on the real engine. :func:`serving` puts any app (a real ingress, an HTTP double) on a
real port of this process; :func:`admin` and :func:`until` are an operator's control calls;
:func:`echoed_choices` is a chat client's ``n`` samples as it echoes them back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import uvicorn
from fastapi import APIRouter, FastAPI
from openai import AsyncOpenAI

from cli.dev.procs import free_port
from ingress.app import create_app
from ingress.control.control_state import ControlState, PauseGate
from ingress.turns.chains import ChainStore
from ingress.turns.service import ChatService, ServiceOptions
from tests.support.doubles import RecordingBus, RecordingPublisher, ScriptedEngine
from tests.support.families import qwen3
from titoflow.engine.pool import EnginePool
from titoflow.settings import Settings
from titoflow.tito.render import ChatRenderer


def scripted_app(
    replies: list[str],
    routers: list[Callable[[], APIRouter]],
    settings: Settings | None = None,
    options: ServiceOptions | None = None,
    engine_type: type[ScriptedEngine] = ScriptedEngine,
    tokenizer: Any = None,
) -> tuple[FastAPI, ScriptedEngine, RecordingPublisher]:
    """An app whose engine (``engine_type``) answers with the token ids of ``replies``, one per
    call; its policy's tokenizer is Qwen3's unless ``tokenizer`` is given."""
    tokenizer = tokenizer or qwen3()
    engine = engine_type(tokenizer, replies)
    publisher = RecordingPublisher()
    app = FastAPI()
    app.state.settings = settings or Settings()
    app.state.service = ChatService(
        renderer=ChatRenderer(tokenizer),
        tokenizer=tokenizer,
        engine=engine,
        publish=publisher,
        publish_together=publisher.together,
        chains=ChainStore(100),
        options=options or ServiceOptions(max_model_len=4096, default_max_tokens=64),
    )
    for make_router in routers:
        app.include_router(make_router())
    return app, engine, publisher


def scripted_ingress(
    settings: Settings, replies: list[str], options: ServiceOptions
) -> tuple[FastAPI, RecordingPublisher, RecordingBus]:
    """The whole ingress of :func:`ingress.app.create_app` (every route of both planes, the
    plane split, its error handlers), its lifespan not run: its service on the scripted engine
    double, its events and control commands recorded (nothing reaches a broker or an engine;
    ``/ready`` answers what the unreachable ones make it)."""
    app = create_app(settings)
    scripted, _, publisher = scripted_app(replies, [], settings, options)
    gate = PauseGate(ControlState(), settings.pause_hold_s)
    bus = RecordingBus(gate.apply)
    app.state.settings = settings
    app.state.service = scripted.state.service
    app.state.control_gate = gate
    app.state.publisher = bus
    app.state.engines = EnginePool.from_settings(settings)
    return app, publisher, bus


def asgi_client(app: FastAPI) -> httpx2.AsyncClient:
    """A client that calls ``app`` in-process. httpx2, because the openai and anthropic SDKs
    take only httpx2 clients as ``http_client``."""
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://ingress")


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """``app`` served over real HTTP from this process (its state within the test's reach)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


ADMIN_TOKEN = "test-admin-token"  # give settings admin_token=ADMIN_TOKEN to call admin()


async def admin(http: httpx.AsyncClient, ingress_url: str, /, **command: Any) -> dict[str, Any]:
    """``POST /admin/control`` with one command; the answer once this replica applied it."""
    response = await http.post(
        f"{ingress_url}/admin/control",
        json=command,
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


async def until(condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> None:
    """Wait for an async ``condition`` (``what`` it waits for names the timeout)."""
    async with asyncio.timeout(timeout_s):
        while not await condition():
            await asyncio.sleep(0.05)


async def echoed_choices(
    client: AsyncOpenAI, n: int, stream: bool, **request: Any
) -> tuple[list[dict[str, Any]], Any]:
    """One chat call asking ``n`` samples: each choice's assistant message as the client echoes
    it back, by choice index (every choice checked to be there and, streamed, to have ended at
    its own index), and the usage the answer reported (None if it reported none)."""
    if not stream:
        answer = await client.chat.completions.create(n=n, **request)
        assert [choice.index for choice in answer.choices] == list(range(n))
        messages = [
            {
                "role": "assistant",
                "content": choice.message.content or "",
                "tool_calls": [c.model_dump() for c in choice.message.tool_calls or []],
            }
            for choice in answer.choices
        ]
        return messages, answer.usage
    texts = [""] * n
    calls: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    finished: list[str | None] = [None] * n
    usage = None
    async for chunk in await client.chat.completions.create(n=n, stream=True, **request):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                assert call.function is not None
                calls[choice.index].append(
                    {"id": call.id, "type": "function", "function": call.function.model_dump()}
                )
            finished[choice.index] = choice.finish_reason or finished[choice.index]
    assert all(finished), finished  # every choice ended, at its own index
    messages = [
        {"role": "assistant", "content": texts[i], "tool_calls": calls[i]} for i in range(n)
    ]
    return messages, usage

"""The ingress HTTP service: transport only. Routes parse, call the service, shape the answer."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ingress import openai_chat
from ingress.chains import ChainStore
from ingress.render import ChatRenderer
from ingress.service import ChatService
from ingress.turn import SessionRef
from schemas.events import SessionFinalized, StepRecorded
from titoflow.bus import BrokerUnavailable, EventTooLarge, Publisher, ensure_topics
from titoflow.engine import VLLMEngine
from titoflow.errors import (
    IngressError,
    InvalidRequest,
    MissingSession,
    PayloadTooLarge,
    PublishFailed,
)
from titoflow.settings import Settings
from titoflow.tokenizer import load_tokenizer

log = logging.getLogger("titoflow.ingress")


def create_app(settings: Settings) -> FastAPI:
    publisher = Publisher(settings)
    engine = VLLMEngine(settings.engine_url, settings.engine_timeout_s)
    steps_topic = settings.topic("steps")

    async def publish(event: StepRecorded | SessionFinalized) -> None:
        try:
            await publisher.publish(steps_topic, event.session_id, event.model_dump_json().encode())
        except BrokerUnavailable as exc:
            raise PublishFailed(f"the step could not be recorded: {exc}") from exc
        except EventTooLarge as exc:
            raise PayloadTooLarge(f"the step is too large to record: {exc}") from exc

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tokenizer = load_tokenizer(settings.model_path)
        app.state.service = ChatService(
            renderer=ChatRenderer(tokenizer),
            decoder=tokenizer,
            engine=engine,
            publish=publish,
            chains=ChainStore(settings.session_cache_size),
            max_model_len=settings.engine_max_model_len,
            default_max_tokens=settings.default_max_tokens,
        )
        try:
            await ensure_topics(settings)  # before the producer's metadata request auto-creates
            await publisher.start()
        except BrokerUnavailable as exc:  # stateless: serve anyway, publishes retry the broker
            log.warning("broker not reachable at startup: %s", exc)
        yield
        await publisher.stop()
        await engine.close()

    app = FastAPI(title="titoflow ingress", lifespan=lifespan)

    @app.exception_handler(IngressError)
    async def ingress_error(request: Request, exc: IngressError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("request failed: %s", exc.message)
        headers = {"Retry-After": "1"} if exc.retryable else None
        return JSONResponse(openai_chat.error_body(exc), status_code=exc.status, headers=headers)

    async def chat(request: Request, session: str | None) -> JSONResponse:
        turn = openai_chat.parse_request(await _json_body(request), session, _headers(request))
        result = await request.app.state.service.complete(turn)
        return JSONResponse(openai_chat.completion_response(result, turn.model))

    @app.post("/sess/{session}/v1/chat/completions")
    async def chat_in_session(request: Request, session: str) -> JSONResponse:
        return await chat(request, session)

    @app.post("/v1/chat/completions")
    async def chat_by_header(request: Request) -> JSONResponse:
        return await chat(request, None)

    async def finalize(request: Request, session: str | None) -> JSONResponse:
        body = await _json_body(request, allow_empty=True)
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        session_id = session or request.headers.get("x-session-id") or body.get("session_id")
        if not session_id:
            raise MissingSession("finalize needs a session: path, X-Session-Id or session_id")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise InvalidRequest("metadata must be an object", "metadata")
        event = await request.app.state.service.finalize(
            SessionRef(session_id=str(session_id)), metadata
        )
        return JSONResponse({"session_id": event.session_id, "finalized": True})

    @app.post("/sess/{session}/finalize")
    async def finalize_in_session(request: Request, session: str) -> JSONResponse:
        return await finalize(request, session)

    @app.post("/finalize")
    async def finalize_by_header(request: Request) -> JSONResponse:
        return await finalize(request, None)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        broker_ok, engine_ok = await publisher.healthy(), await engine.healthy()
        status = 200 if broker_ok and engine_ok else 503
        return JSONResponse({"broker": broker_ok, "engine": engine_ok}, status_code=status)

    return app


def _headers(request: Request) -> dict[str, str]:
    return {key.lower(): value for key, value in request.headers.items()}


async def _json_body(request: Request, allow_empty: bool = False) -> Any:
    raw = await request.body()
    if not raw and allow_empty:
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc

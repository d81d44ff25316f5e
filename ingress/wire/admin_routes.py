"""Operator routes, never under a per-session base URL: the control endpoint (authenticated
with ``admin_token``; disabled without one), the pause state and the engine pool's state.

Invariant: a control command is answered 200 only once the broker acknowledged it (else 503)
and, unless that takes longer than ``publish_timeout_s``, once this replica applied it, so the
caller's next request to this replica sees the new state."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ingress.control.control_state import PauseGate
from ingress.wire import errors, http
from titoflow.bus import BrokerUnavailable, Publisher
from titoflow.control import control_event, publish_control
from titoflow.engine.pool import EnginePool
from titoflow.errors import InvalidRequest, NotFound, PublishFailed, TitoflowError, Unauthorized

APPLIED_POLL_S = 0.02


def _gate(request: Request) -> PauseGate:
    gate: PauseGate = request.app.state.control_gate
    return gate


def _engines(request: Request) -> list[dict[str, Any]]:
    pool: EnginePool = request.app.state.engines
    return [dataclasses.asdict(status) for status in pool.status()]


def _check_token(request: Request) -> None:
    token = http.settings(request).admin_token
    if not token:
        raise NotFound("the admin endpoint is disabled: set TITOFLOW_ADMIN_TOKEN to enable it")
    if not http.presents(request, token):
        raise Unauthorized("a valid admin token is required (Authorization: Bearer <token>)")


async def control(request: Request) -> Response:
    try:
        _check_token(request)
        body = await http.read_json(request)
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        try:
            event = control_event(body, issued_by="admin")
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        publisher: Publisher = request.app.state.publisher
        settings = http.settings(request)
        try:
            offset = await publish_control(publisher, settings, event)
        except BrokerUnavailable as exc:
            raise PublishFailed(f"the control event was not recorded: {exc.message}") from exc
        gate = _gate(request)
        # Answer once this replica applied it, so the caller's next request sees the new state.
        try:
            async with asyncio.timeout(settings.publish_timeout_s):
                while gate.state.offset < offset:
                    await asyncio.sleep(APPLIED_POLL_S)
        except TimeoutError:
            pass  # recorded; this replica applies it when its follower catches up
    except TitoflowError as exc:
        return errors.OPENAI.response(exc)
    result: dict[str, Any] = {
        "offset": offset,
        "event": event.model_dump(),
        **gate.snapshot(),
        "engines": _engines(request),
    }
    return JSONResponse(result)


def router() -> APIRouter:
    routes = APIRouter()
    routes.add_api_route("/admin/control", control, methods=["POST"])

    @routes.get("/v1/rollout/pause_state")
    async def pause_state(request: Request) -> dict[str, Any]:
        return _gate(request).snapshot()

    @routes.get("/v1/rollout/engines")
    async def engines(request: Request) -> dict[str, Any]:
        return {"engines": _engines(request)}

    return routes

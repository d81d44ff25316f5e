"""Session operations and discovery routes shared by every API: open, finalize, discard, a
session's state, models, base URL. Errors are in OpenAI's shape.

Opening, finalizing, discarding and reading a session's state are the driver plane: they set
rewards and end sessions, so with ``driver_token`` set they answer 401 without it
(``Authorization: Bearer <token>``, compared in constant time) and publish nothing. A scaffold's
own API key never passes: agent code holding its base URL cannot grade itself or end any session.
A session ends once: a second finalize or discard is a 409 naming the first end
(:mod:`ingress.turns.ended_sessions`)."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field

from ingress.turns.turn import SessionRef
from ingress.wire import errors, http
from schemas.events import SamplingOverrides, SessionBudget, SessionOptions
from titoflow.errors import InvalidRequest, TitoflowError, Unauthorized

# Options that shape how the ingress renders, not how workers assemble. The ingress keeps no
# per-session state (any replica serves any call, and none reads the steps log), so they can
# only be deployment-wide settings.
_DEPLOYMENT_WIDE = {"matcher": "TITOFLOW_MATCHER", "partial_rollout": "the control plane"}


class _Options(SessionOptions):
    model_config = ConfigDict(extra="forbid", frozen=True)  # a misspelt option is an error


class _Budget(SessionBudget):
    model_config = ConfigDict(extra="forbid", frozen=True)  # a misspelt limit is an error


class _Sampling(SamplingOverrides):
    model_config = ConfigDict(extra="forbid", frozen=True)  # an unknown parameter is an error


class OpenSessionBody(http.Lenient):
    session_id: str | None = Field(None, pattern=http.SESSION_ID_PATTERN)
    instance_id: str | None = None
    channel: str | None = None
    metadata: dict[str, Any] | None = None
    options: _Options = Field(default_factory=_Options)
    budget: _Budget = Field(default_factory=_Budget)
    sampling: _Sampling = Field(default_factory=_Sampling)


class CloseSessionBody(http.Lenient):
    """Finalize and discard: a reward (finalize only: a number, or named numbers) and
    metadata that the session's segments (or its discard notice) carry."""

    reward: float | dict[str, float] | None = None
    metadata: dict[str, Any] | None = None


def base_urls(request: Request, session_id: str) -> dict[str, str]:
    """Where clients of each API point for this session: the public URL setting, else the
    scheme and Host the request came in with. With a driver listener the open call came in
    there: the scaffold's URLs name the scaffold listener, the driver's stay where it called."""
    config = http.settings(request)
    here = str(request.base_url).rstrip("/")
    scaffold = (
        str(request.base_url.replace(port=config.ingress_port)) if config.driver_port else here
    )
    session = f"{(config.public_url or scaffold).rstrip('/')}/sess/{session_id}"
    driver = f"{here}/sess/{session_id}" if config.driver_port else session
    return {
        "openai_base_url": f"{session}/v1",
        "anthropic_base_url": session,  # the Anthropic SDK appends /v1/messages itself
        "generate_url": f"{session}/generate",
        "finalize_url": f"{driver}/finalize",
        "discard_url": f"{driver}/discard",
    }


def check_driver(request: Request) -> None:
    """Refuse a driver-plane call without the driver token (when one is set)."""
    token = http.settings(request).driver_token
    if token and not http.presents(request, token):
        raise Unauthorized(
            "opening, finalizing and discarding sessions needs the driver token "
            "(Authorization: Bearer <token>); a session's API key is not it"
        )


async def open_session(request: Request) -> Response:
    try:
        check_driver(request)
        raw = await http.read_json(request, allow_empty=True)
        options = raw.get("options") if isinstance(raw, dict) else None
        for name, setting in _DEPLOYMENT_WIDE.items():
            if isinstance(options, dict) and name in options:
                raise InvalidRequest(
                    f"options.{name} is deployment-wide ({setting}): the ingress keeps no "
                    "per-session state, so any replica must render every session alike",
                    f"options.{name}",
                )
        body = http.validated(OpenSessionBody, raw)
        ref = SessionRef(
            session_id=body.session_id or uuid.uuid4().hex, instance_id=body.instance_id
        )
        event = await http.service(request).open_session(
            ref, body.channel, body.metadata or {}, body.options, body.budget, body.sampling
        )
    except TitoflowError as exc:
        return errors.OPENAI.response(exc)
    secret = http.settings(request).driver_token
    return JSONResponse(
        {
            "session_id": event.session_id,
            "instance_id": event.instance_id,
            "channel": event.channel,
            # The scaffold's API key: with implicit sessions off, its only credential.
            "api_key": http.session_key(secret, event.session_id) if secret else "",
            **base_urls(request, event.session_id),
        }
    )


async def _close(request: Request, session: str | None, discard: bool) -> Response:
    try:
        check_driver(request)
        raw = await http.read_json(request, allow_empty=True)
        if not isinstance(raw, dict):
            raise InvalidRequest("the body must be a JSON object")
        ref = http.session_ref(session, http.lower_headers(request), raw)
        body = http.validated(CloseSessionBody, raw)
        svc = http.service(request)
        if discard:
            if body.reward is not None:
                raise InvalidRequest("a discarded session has no reward", "reward")
            await svc.discard(ref, body.metadata or {})
            return JSONResponse({"session_id": ref.session_id, "discarded": True})
        scalar = body.reward if not isinstance(body.reward, dict) else None
        components = body.reward if isinstance(body.reward, dict) else {}
        await svc.finalize(ref, body.metadata or {}, scalar, components)
    except TitoflowError as exc:
        return errors.OPENAI.response(exc)
    return JSONResponse({"session_id": ref.session_id, "finalized": True})


def driver_router() -> APIRouter:
    """The driver plane: what opens, ends or reads sessions (ingress/wire/planes.py)."""
    routes = APIRouter()
    routes.add_api_route("/v1/sessions", open_session, methods=["POST"])

    @routes.get("/v1/sessions/{session}")
    async def session_state(request: Request, session: str) -> Response:
        try:
            check_driver(request)
            ended = http.service(request).ended.get(http.checked_session_id(session, "the path"))
        except TitoflowError as exc:
            return errors.OPENAI.response(exc)
        how = {"how": ended.how, "at": ended.event_time} if ended else None
        return JSONResponse({"session_id": session, "ended": how})

    http.post_both_ways(routes, "/finalize", partial(_close, discard=False))
    http.post_both_ways(routes, "/discard", partial(_close, discard=True))
    return routes


def router() -> APIRouter:
    """What a scaffold finds at its base URL: the models and the base URL itself."""
    routes = APIRouter()

    @routes.get("/v1/models")
    @routes.get("/sess/{session}/v1/models")
    async def models(request: Request) -> dict[str, object]:
        config = http.settings(request)
        names = [config.served_model_name]
        if config.accepted_models != "*":
            names = [m.strip() for m in config.accepted_models.split(",")]
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "owned_by": "titoflow"} for n in names],
        }

    # Claude Code probes its base URL (HEAD /sess/<id>) before connecting; SDKs may GET it.
    @routes.api_route("/sess/{session}", methods=["GET", "HEAD"])
    @routes.api_route("/sess/{session}/v1", methods=["GET", "HEAD"])
    async def base_url(session: str) -> Response:
        try:
            http.checked_session_id(session, "the path")
        except TitoflowError as exc:
            return errors.OPENAI.response(exc)
        return JSONResponse({"session_id": session, "status": "ok"})

    return routes

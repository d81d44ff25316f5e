"""What the ingress' routes share (chat adapters, token API, session and admin routes): the two
addresses of a call, the service, bounded JSON bodies and their lenient models, session refs and
keys, the model check and JSON answers.

Invariants: a body is read within ``max_request_bytes`` whether or not it declares its length,
and parsed within :mod:`ingress.wire.json_body`'s bounds (``max_json_depth``; only values JSON
carries back unchanged), a 4xx otherwise. A session call names one session id of
:data:`SESSION_ID_PATTERN`'s form, resolved (and its key checked) before its body is parsed, and
its model is checked before the service sees it. Statuses and error bodies are
``ingress/wire/errors.py``'s, streams ``ingress/wire/sse.py``'s."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError

from ingress.turns.service import ChatService
from ingress.turns.turn import SessionRef
from ingress.wire.json_body import parse_json
from titoflow.errors import (
    Forbidden,
    InvalidRequest,
    MissingSession,
    PayloadTooLarge,
    Unauthorized,
    UnknownModel,
)
from titoflow.settings import Settings

_Model = TypeVar("_Model", bound=BaseModel)

SessionCall = Callable[[Request, str | None], Awaitable[Response]]


def post_both_ways(routes: APIRouter, path: str, call: SessionCall) -> None:
    """Serve ``call`` on ``/sess/<id><path>`` (the session in the base URL) and on ``path``
    (the session in headers or the body; ``call`` gets ``None`` and resolves it)."""

    async def in_session(request: Request) -> Response:
        return await call(request, request.path_params["session"])

    async def by_header(request: Request) -> Response:
        return await call(request, None)

    routes.add_route(f"/sess/{{session}}{path}", in_session, methods=["POST"])
    routes.add_route(path, by_header, methods=["POST"])


class Lenient(BaseModel):
    """A body model that ignores fields it does not name: clients send many we do not use
    (stream_options, cache_control, store, ...), and a new one must not break them."""

    model_config = ConfigDict(extra="ignore")


def validated(model: type[_Model], data: Any, at: str = "") -> _Model:
    """``data`` as ``model``, or a 400 naming the first offending field (``at`` prefixes it)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in (*([at] if at else []), *first["loc"])) or None
        message = f"{param}: {first['msg']}" if param else f"the body: {first['msg']}"
        raise InvalidRequest(message, param) from exc


def service(request: Request) -> ChatService:
    svc: ChatService = request.app.state.service
    return svc


def settings(request: Request) -> Settings:
    config: Settings = request.app.state.settings
    return config


def lower_headers(request: Request) -> dict[str, str]:
    return {key.lower(): value for key, value in request.headers.items()}


async def read_json(request: Request, allow_empty: bool = False) -> Any:
    config = settings(request)
    limit = config.max_request_bytes
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body has {declared} bytes; the limit is {limit}")
    raw = bytearray()
    async for chunk in request.stream():  # bounded even without a Content-Length
        raw += chunk
        if len(raw) > limit:
            raise PayloadTooLarge(f"the body exceeds the limit of {limit} bytes")
    if not raw and allow_empty:
        return {}
    return parse_json(raw, config.max_json_depth)


def session_key(secret: str, session_id: str) -> str:
    """A session's capability: what its scaffold sends as API key. Derived from the driver
    token, so every replica checks it without shared state, and no key opens another session."""
    mac = hmac.new(secret.encode(), b"titoflow-session\0" + session_id.encode(), hashlib.sha256)
    return "tfk-" + mac.hexdigest()[:40]


def presents(request: Request, expected: str, api_key_header: bool = False) -> bool:
    """Whether the request carries ``expected`` as its bearer token (or, with
    ``api_key_header``, as ``x-api-key``, as the Anthropic SDK sends its key); compared in
    constant time."""
    given = (request.headers.get("x-api-key") if api_key_header else None) or request.headers.get(
        "authorization", ""
    )
    return hmac.compare_digest(given.removeprefix("Bearer ").strip().encode(), expected.encode())


def check_session_key(request: Request, session_id: str, body: Any) -> None:
    """With session keys on (``driver_token`` set, ``implicit_sessions`` off), a scaffold-plane
    call must carry its session's key (``Authorization: Bearer`` or ``x-api-key``, as every SDK
    sends its API key); on the shared routes, its headers and body may name no other session."""
    config = settings(request)
    if not config.driver_token or config.implicit_sessions:
        return
    fields = body if isinstance(body, dict) else {}
    path = request.path_params.get("session")
    # A /sess/<id>/ path names the session alone: session_ref reads it first, so no header or
    # body field can move the call elsewhere, and scaffolds send such headers of their own
    # (OpenCode's x-session-id carries its internal session id).
    named = [path] if path else _session_names(None, lower_headers(request), fields)
    if {str(n) for n in named if n not in (None, "")} - {session_id}:
        raise Forbidden("the request names more than one session")
    if not presents(request, session_key(config.driver_token, session_id), api_key_header=True):
        raise Unauthorized(
            f"session {session_id} needs its own key as the API key (the open call's api_key)"
        )


def check_counting_key(request: Request, body: Any) -> None:
    """count_tokens records nothing, so it needs no open session; but it fetches the image URLs
    it is sent from the replica's network position, so with session keys on it carries the key
    of the session it names (path, header or body), as every scaffold-plane call does, and
    without one it is refused before anything is fetched."""
    config = settings(request)
    if not config.driver_token or config.implicit_sessions:
        return
    fields = body if isinstance(body, dict) else {}
    session = session_ref(request.path_params.get("session"), lower_headers(request), fields)
    check_session_key(request, session.session_id, body)


# Session ids become URL paths (/sess/<id>/v1), Kafka keys and log and trace fields: letters,
# digits and ``._:-`` (no client escapes them), at most 128, starting with a letter or digit.
SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_SESSION_ID = re.compile(SESSION_ID_PATTERN.removeprefix("^").removesuffix("$"))


def checked_session_id(value: Any, where: str) -> str:
    """``value`` (read from ``where``) as a session id, or a 400 saying what one is. Numbers
    are taken as their digits."""
    text = str(value) if type(value) is int else value
    if not isinstance(text, str) or not _SESSION_ID.fullmatch(text):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise InvalidRequest(
            f"{where}: {shown} is not a session id (1 to 128 letters, digits, '.', '_', ':' or "
            "'-', starting with a letter or digit)",
            "session_id",
        )
    return text


# Where a request may name its session, in the order session_ref reads them.
_SESSION_PLACES = (
    "the path",
    "X-Session-Id",
    "X-SMG-Routing-Key",
    "session_id",
    "metadata.session_id",
)


def _session_names(
    path_session: str | None, headers: dict[str, str], body_fields: dict[str, Any]
) -> list[Any]:
    """Every place a request may name its session, in the order :func:`session_ref` reads
    them: the path, ``X-Session-Id``, ``X-SMG-Routing-Key`` (a routing gateway's session key),
    the body's ``session_id``, then ``metadata.session_id`` (:data:`_SESSION_PLACES`)."""
    metadata = body_fields.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    return [
        path_session,
        headers.get("x-session-id"),
        headers.get("x-smg-routing-key"),
        body_fields.get("session_id"),
        metadata.get("session_id"),
    ]


def session_ref(
    path_session: str | None,
    headers: dict[str, str],
    body_fields: dict[str, Any],
) -> SessionRef:
    """Session id from the first place that names one (:func:`_session_names`), which must be
    a session id; instance and turn ids from their headers, then the body's fields, then its
    metadata (strings, or numbers taken as their digits)."""
    metadata = body_fields.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}

    def pick(header: str, field: str) -> str | None:
        value = headers.get(header) or body_fields.get(field) or metadata.get(field)
        if value is None or type(value) is str:
            return value
        if type(value) is int:
            return str(value)
        where = field if body_fields.get(field) is value else f"metadata.{field}"
        raise InvalidRequest(f"{where}: must be a string", where)

    session_id = None
    for place, name in zip(
        _SESSION_PLACES, _session_names(path_session, headers, body_fields), strict=True
    ):
        if name is not None and name != "":
            session_id = checked_session_id(name, place)
            break
    if session_id is None:
        raise MissingSession(
            "no session: use a /sess/<id>/v1 base URL, an X-Session-Id header, "
            "or a session_id field",
            "session_id",
        )
    return SessionRef(
        session_id=session_id,
        instance_id=pick("x-instance-id", "instance_id"),
        turn_id=pick("x-turn-id", "turn_id"),
    )


def session_of(request: Request, path_session: str | None, body: Any) -> SessionRef:
    """The call's session, resolved once, before its body is parsed into a call: read as
    :func:`session_ref` reads it, its key checked (:func:`check_session_key`)."""
    fields = body if isinstance(body, dict) else {}
    ref = session_ref(path_session, lower_headers(request), fields)
    check_session_key(request, ref.session_id, body)
    return ref


def check_model(request: Request, model: str) -> None:
    accepted = settings(request).accepted_models
    if accepted != "*" and model not in {m.strip() for m in accepted.split(",")}:
        raise UnknownModel(
            f"the model {model!r} is not served here; use one of: {accepted}", "model"
        )


def json_response(payload: Any) -> Response:
    """A 200 JSON answer serialized by orjson (a fifth of the standard library's cost), with
    JSONResponse as the fallback for what orjson refuses (integers beyond 64 bits)."""
    try:
        return Response(orjson.dumps(payload), media_type="application/json")
    except TypeError:
        return JSONResponse(payload)

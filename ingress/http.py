"""What the ingress' routes share (chat adapters, token API, session and admin routes): the two
addresses of a call, the service, bounded JSON bodies and their lenient models, session refs and
keys, the admission checks and JSON answers.

Invariants: a body is read within ``max_request_bytes`` whether or not it declares its length,
nests at most ``max_json_depth`` arrays and objects deep, and holds only values JSON can carry
back unchanged (no NaN, no infinity, no lone surrogate); whatever its depth or content, reading
it never recurses past a bound nor raises anything but a 4xx. A session call names one session
id of :data:`SESSION_ID_PATTERN`'s form and is admitted (its session's key, then its model)
before the service sees it. Statuses and error bodies are
``ingress/errors.py``'s, streams ``ingress/sse.py``'s."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError

from ingress.service import ChatService
from ingress.turn import ChatTurn, SessionRef, TokenCall
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


def parse_json(raw: bytes | bytearray, max_depth: int) -> Any:
    """A body's JSON value, nested at most ``max_depth`` arrays and objects deep, else a 400."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = _loads_slowly(raw, max_depth)
    if nesting_exceeds(value, max_depth):
        raise InvalidRequest(_too_deep(max_depth))
    return value


def _loads_slowly(raw: bytes | bytearray, max_depth: int) -> Any:
    """What orjson refused, read by the standard library, which has the final word: lone
    surrogates, which clients do send (mended), and bodies orjson finds too deep (beyond 1,024
    levels) or invalid, which it explains. Its recursion is bounded by Python's, so a body too
    deep for it is refused too, never a crash."""
    try:
        value = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
    except RecursionError as exc:
        raise InvalidRequest(_too_deep(max_depth)) from exc
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    return _mend_surrogates(value)


# The deepest nesting orjson.dumps writes (it refuses more: "Recursion limit reached").
_ORJSON_DEPTH = 254


class _Wrappers(threading.local):
    """Per thread and depth limit, ``_ORJSON_DEPTH - limit`` nested one-element arrays, the
    innermost a slot for the value probed: built once, as building them cost more than
    writing a small body."""

    def __init__(self) -> None:
        self.by_limit: dict[int, tuple[list[Any], list[Any]]] = {}

    def around(self, limit: int) -> tuple[list[Any], list[Any]]:
        """The outermost array and the slot."""
        if limit not in self.by_limit:
            slot: list[Any] = [None]
            outer = slot
            for _ in range(_ORJSON_DEPTH - limit - 1):
                outer = [outer]
            self.by_limit[limit] = outer, slot
        return self.by_limit[limit]


_WRAPPERS = _Wrappers()


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep (``limit`` below
    :data:`_ORJSON_DEPTH`). orjson checks it in C: ``value`` inside as many arrays as orjson
    writes beyond ``limit`` levels is written, or refused as too deep — a fifth of a walk's
    cost on Claude Code's requests. What orjson refuses for another reason (an integer beyond
    64 bits, from the standard library's parse) is walked instead."""
    outer, slot = _WRAPPERS.around(limit)
    slot[0] = value
    try:
        orjson.dumps(outer)
    except orjson.JSONEncodeError:
        return _walk_exceeds(value, limit)
    finally:
        slot[0] = None  # holds no body past its check
    return False


def _walk_exceeds(value: Any, limit: int) -> bool:
    """:func:`nesting_exceeds` walked with a stack of its own, so no depth makes it recurse."""
    if type(value) is not dict and type(value) is not list:
        return False
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > limit:
            return True
        for child in node.values() if type(node) is dict else node:
            kind = type(child)  # exact types: what a JSON parser makes, checked fastest
            if kind is dict or kind is list:
                push((child, depth + 1))
    return False


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins the escapes of a pair


def _mend_surrogates(value: Any) -> Any:
    """``value`` with each lone surrogate (what a client sends that cut a UTF-16 string
    between the halves of a pair) replaced by U+FFFD, as a UTF-8 decoder replaces any invalid
    sequence: no tokenizer takes them as text. Deterministic, so a re-sent history reads the
    same. Walked with a stack of its own, like :func:`_walk_exceeds`."""
    root = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        container, key = stack.pop()
        node = container[key]
        if isinstance(node, str):
            container[key] = _LONE_SURROGATE.sub("\ufffd", node)
        elif isinstance(node, list):
            stack.extend((node, index) for index in range(len(node)))
        elif isinstance(node, dict):
            mended = {_LONE_SURROGATE.sub("\ufffd", name): child for name, child in node.items()}
            container[key] = mended
            stack.extend((mended, name) for name in mended)
    return root[0]


def _too_deep(limit: int) -> str:
    return (
        f"the body nests arrays and objects more than {limit} levels deep "
        "(the limit: TITOFLOW_MAX_JSON_DEPTH)"
    )


def _not_json(constant: str) -> Any:
    """NaN and ±Infinity are not JSON. Refused, so every body holds only values that orjson
    writes back as they came: caches key parsed messages and tools by those bytes."""
    raise ValueError(f"{constant} is not a JSON value")


def _finite(literal: str) -> float:
    """A number literal beyond a double (``1e999``) would be read as ±inf, which JSON cannot
    carry back: refused like NaN."""
    number = float(literal)
    if math.isinf(number):
        raise ValueError(f"{literal} is beyond the range of a double")
    return number


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


# Session ids become URL paths (/sess/<id>/v1), Kafka keys and log and trace fields: letters,
# digits and ``._:-`` (no client escapes them), at most 128, starting with a letter or digit.
SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_SESSION_ID = re.compile(SESSION_ID_PATTERN.removeprefix("^").removesuffix("$"))


def checked_session_id(value: Any, where: str) -> str:
    """``value`` (read from ``where``) as a session id, or a 400 saying what one is. Numbers
    are taken as their digits, as they always were."""
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


def admit(request: Request, call: ChatTurn | TokenCall, body: Any) -> None:
    """The checks a parsed session call passes before the service sees it."""
    check_session_key(request, call.session.session_id, body)
    check_model(request, call.model)


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

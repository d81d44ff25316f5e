"""The ingress' one error module: the HTTP status of each domain error and each API's error shape.

Invariants:
- A status belongs to an error class and is looked up along its MRO, so a subclass answers as
  its nearest mapped base does (``Paused`` as ``Unavailable``: 503); every
  :class:`~titoflow.errors.TitoflowError` has one (500 for the base).
- Every error a client sees is in the shape of the API it called: OpenAI's
  ``{"error": {message, type, param, code, ...}}`` (chat, responses, and the token, session and
  admin routes), Anthropic's ``{"type": "error", "error": {type, message}}``; inside a stream,
  after the status line, the event that API's SDKs read as an error. A request no route took
  (unknown path, method, plane, or a bug) is answered in the shape its path belongs to.
- A retryable error carries ``Retry-After`` (the error's ``retry_after_s``); a refusal no retry
  can change (a 4xx) says ``x-should-retry: false``.
- Every refusal answered before the status line (a 4xx by the domain's status: bad input,
  ended sessions, budgets, overload) is counted in
  ``titoflow_ingress_refusals_total`` by its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ingress.turns import metrics
from titoflow.errors import (
    ContextOverflow,
    EngineError,
    Forbidden,
    InvalidRequest,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    SessionAlreadyEnded,
    TitoflowError,
    TrajectoryVersionChanged,
    Unauthorized,
    Unavailable,
    UnknownModel,
)

log = logging.getLogger("titoflow.ingress")

_STATUS: dict[type[TitoflowError], int] = {
    TitoflowError: 500,
    InvalidRequest: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    UnknownModel: 404,
    TrajectoryVersionChanged: 409,
    SessionAlreadyEnded: 409,
    PayloadTooLarge: 413,
    Overloaded: 429,
    EngineError: 502,
    Unavailable: 503,
}


def status_of(error: TitoflowError) -> int:
    """The HTTP status of ``error``: its class's, else its nearest mapped base's."""
    return next(_STATUS[cls] for cls in type(error).__mro__ if cls in _STATUS)


@dataclass(frozen=True)
class ErrorShape:
    """How one API reports an error: the status it answers with, the body before the status
    line, and the event payload that ends a stream after it."""

    status: Callable[[TitoflowError], int]
    body: Callable[[TitoflowError], dict[str, Any]]
    event: Callable[[TitoflowError], dict[str, Any]]

    def response(self, error: TitoflowError) -> JSONResponse:
        if status_of(error) < 500:  # a refusal, not a failure (those have their own counters)
            metrics.REFUSALS.labels(error.reason).inc()
        headers = {"retry-after": str(error.retry_after_s)} if error.retryable else None
        if status_of(error) < 500 and not error.retryable:
            # The SDKs (openai, anthropic, Claude Code's, OpenCode's) obey it over their status
            # rules, which retry a 409 (an ended session) that no retry can change.
            headers = {"x-should-retry": "false"}
        return JSONResponse(self.body(error), status_code=self.status(error), headers=headers)


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


def _openai_body(error: TitoflowError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": _OPENAI_TYPES.get(status_of(error), "server_error"),
            "param": error.param,
            "code": error.code,
            **error.details(),
        }
    }


def _responses_param(param: str | None) -> str | None:
    """A parameter as the Responses API names it: the conversation the service checks (images,
    template) is ``messages`` in chat's terms and ``input`` in this API's."""
    if param == "messages" or (param or "").startswith("messages."):
        return "input" + (param or "")[len("messages") :]
    return param


def _responses_body(error: TitoflowError) -> dict[str, Any]:
    body = _openai_body(error)
    body["error"]["param"] = _responses_param(error.param)
    return body


def _responses_event(error: TitoflowError) -> dict[str, Any]:
    # The SDK's ResponseErrorEvent: flat, unlike the body before the status line.
    return {
        "type": "error",
        "code": error.code,
        "message": error.message,
        "param": _responses_param(error.param),
    }


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
}


def _anthropic_status_and_type(error: TitoflowError) -> tuple[int, str]:
    if isinstance(error, Overloaded):
        # Not 529: Claude Code drops a 529 of its background queries unretried and gives up
        # after three when a fallback model is set; a 429 it retries (API key, not claude.ai
        # login) up to CLAUDE_CODE_MAX_RETRIES, as litellm-based scaffolds retry a rate limit.
        return 429, "rate_limit_error"
    if error.retryable:  # 529 is what Claude Code and the SDKs retry with backoff
        return 529, "overloaded_error"
    status = status_of(error)
    if status in _ANTHROPIC_TYPES:
        return status, _ANTHROPIC_TYPES[status]
    return 500, "api_error"


def _anthropic_body(error: TitoflowError) -> dict[str, Any]:
    _, kind = _anthropic_status_and_type(error)
    message = error.message
    if isinstance(error, ContextOverflow):  # Claude Code recognises this wording (offers /compact)
        message = f"prompt is too long: {error.prompt_tokens} tokens > {error.limit} maximum"
    return {"type": "error", "error": {"type": kind, "message": message}}


OPENAI = ErrorShape(status_of, _openai_body, _openai_body)
RESPONSES = ErrorShape(status_of, _responses_body, _responses_event)
ANTHROPIC = ErrorShape(
    lambda error: _anthropic_status_and_type(error)[0], _anthropic_body, _anthropic_body
)


def shape_of(path: str) -> ErrorShape:
    """The error shape of the API ``path`` belongs to: Anthropic's messages routes, else
    OpenAI's (Responses answers OpenAI's body before the status line)."""
    return ANTHROPIC if "/v1/messages" in path else OPENAI


def in_path_shape(request: Request, error: TitoflowError) -> Response:
    return shape_of(request.url.path).response(error)


async def unknown_route_response(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods answer in the error shape of the API the path belongs to."""
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 404
    error: TitoflowError = NotFound(f"no such operation: {request.method} {request.url.path}")
    if status == 405:
        error = InvalidRequest(f"{request.method} is not allowed on {request.url.path}")
    return in_path_shape(request, error)


async def unexpected_error_response(request: Request, exc: Exception) -> Response:
    """A bug still answers in the API's own error shape (a 500), never as plain text."""
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return in_path_shape(request, TitoflowError(f"internal error: {type(exc).__name__}"))

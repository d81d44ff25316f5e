"""The turn routes served straight from ASGI, in front of FastAPI's exception middleware and
router: a chat, messages, responses or token call is one dictionary look-up on its path, not a
walk over every route's pattern (FastAPI's stack is a visible share of a turn:
docs/benchmarks.md §4h).

Invariant: a request answers exactly as FastAPI answers it. Only POSTs whose path one of the
given routes matches whole are taken here (``/sess/<id><suffix>``, ``<id>`` one segment, as
Starlette's ``{session}`` matches; or the plain path), by the very endpoint Starlette would call,
with the path parameters and ``Request`` it would build; every other request (another method:
405, an unknown path, a root path, lifespan) goes on to FastAPI. It sits inside the
server-error middleware and the plane split, so a bug still answers as
:func:`~ingress.wire.errors.unexpected_error_response` does and a route of the other plane is still
refused; an ``HTTPException`` before the answer starts is answered as the exception middleware
would, by :func:`~ingress.wire.errors.unknown_route_response`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ingress.wire.errors import unknown_route_response

Endpoint = Callable[[Request], Awaitable[Response]]
SESSION_PREFIX = "/sess/{session}"


class HotRoutes:
    """ASGI middleware serving ``routes`` (plain Starlette POST routes at a fixed path or under
    ``/sess/{session}``) itself; anything else passes to ``app``."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.plain: dict[str, Endpoint] = {}
        self.in_session: dict[str, Endpoint] = {}  # path after /sess/<id>
        for route in routes:
            if not isinstance(route, Route) or isinstance(route, APIRoute):
                continue  # FastAPI's own routes validate and serialize: theirs to serve
            if route.methods != {"POST"}:
                continue
            if route.path.startswith(SESSION_PREFIX + "/"):
                suffix = route.path.removeprefix(SESSION_PREFIX)
                if "{" not in suffix:
                    self.in_session[suffix] = route.endpoint
            elif "{" not in route.path:
                self.plain[route.path] = route.endpoint

    def match(self, path: str) -> tuple[Endpoint | None, dict[str, str]]:
        if path.startswith("/sess/"):
            slash = path.find("/", 6)
            if slash > 6:
                return self.in_session.get(path[slash:]), {"session": path[6:slash]}
            return None, {}
        return self.plain.get(path), {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            endpoint, params = self.match(scope["path"])
            if endpoint is not None:
                scope["endpoint"], scope["path_params"] = endpoint, params
                request = Request(scope, receive, send)
                try:
                    response = await endpoint(request)
                except StarletteHTTPException as exc:
                    response = await unknown_route_response(request, exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

"""The ingress' two planes, and with a driver listener, which listener serves which.

The scaffold plane is what agent code reaches through its base URL; the driver plane opens,
ends, scores and reads sessions and carries control. With ``driver_port`` set, a request is
served only where its plane matches the listener it arrived on (the local port of its
connection): on the scaffold listener the driver routes do not exist, whatever the token, the
headers or the body say, and the driver listener serves nothing a scaffold needs. Which routes
are the driver's comes from the driver routers themselves, matched as Starlette routes them,
never from a second list of paths that could drift from the routes.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from ingress.wire.errors import in_path_shape
from titoflow.errors import NotFound

# Served on every listener: probes and metrics carry no session and no reward.
EVERYWHERE = frozenset({"/health", "/ready", "/metrics"})


class PlaneSplit:
    """ASGI middleware: ``driver_routes`` only on ``driver_port``, everything else only on the
    other listener(s); a request on the wrong one gets a 404 in its API's shape."""

    def __init__(self, app: ASGIApp, driver_routes: Sequence[BaseRoute], driver_port: int) -> None:
        self.app = app
        self.driver_routes = tuple(driver_routes)
        self.driver_port = driver_port

    def is_driver(self, scope: Scope) -> bool:
        # PARTIAL: the path is a driver route's with another method; still not the scaffold's.
        return any(route.matches(scope)[0] is not Match.NONE for route in self.driver_routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in EVERYWHERE:
            server = scope.get("server") or (None, None)
            on_driver_listener = server[1] == self.driver_port
            if self.is_driver(scope) != on_driver_listener:
                request = Request(scope, receive)
                plane = "scaffold" if on_driver_listener else "driver"
                error = NotFound(
                    f"no such operation on this listener: {request.method} {request.url.path} "
                    f"(the {plane} plane is served elsewhere)"
                )
                await in_path_shape(request, error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

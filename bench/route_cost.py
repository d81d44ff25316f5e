"""The ingress' HTTP stack per request, in process: the whole app of ``ingress.app.create_app``
called as ASGI (no server, no socket) with a turn route's POST that its handler refuses at once
(a 400: its messages are not a list), with its hot routes (``ingress/wire/hot_routes.py``) and
without them (FastAPI's middleware and router serving every route), interleaved rounds, CPU µs
a request (median over rounds). What differs is the stack's cost alone: the same handler runs.

    .venv/bin/python -m bench.route_cost [--calls 3000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any, cast

from fastapi import FastAPI

from ingress.app import create_app
from ingress.wire.hot_routes import HotRoutes
from titoflow.settings import Settings

BODY = b'{"model": "m", "messages": "not a list"}'


def app_of(hot: bool, driver_port: int) -> FastAPI:
    settings = Settings(driver_port=driver_port)
    app = create_app(settings)
    app.state.settings = settings
    if not hot:
        hot_routes = cast(object, HotRoutes)
        app.user_middleware = [m for m in app.user_middleware if m.cls is not hot_routes]
    return app


async def call(app: Any, path: str) -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
    }
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def cost_us(app: Any, path: str, calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        await call(app, path)
    return (time.process_time() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for driver_port in (0, 8001):
        apps = {"hot routes": app_of(True, driver_port), "FastAPI only": app_of(False, driver_port)}
        for path in ("/v1/chat/completions", "/sess/s1/v1/chat/completions"):
            statuses = {name: asyncio.run(call(app, path)) for name, app in apps.items()}
            assert set(statuses.values()) == {400}, statuses
            costs: dict[str, list[float]] = {name: [] for name in apps}
            for _ in range(args.rounds):
                for name, app in apps.items():
                    costs[name].append(asyncio.run(cost_us(app, path, args.calls)))
            shown = ", ".join(f"{n}: {statistics.median(c):.1f} µs" for n, c in costs.items())
            print(f"driver_port={driver_port} POST {path}: {shown}")


if __name__ == "__main__":
    main()

"""FLOOR PROXY for benchmarks: the least any Python ingress with durable steps must do per turn.

A pass-through on the ingress' own stack (uvicorn on uvloop and httptools, the ingress' engine
client (titoflow/engine/http1.py), titoflow's :class:`titoflow.bus.Publisher` with its producer
settings):
``POST /v1/chat/completions`` reads and decodes the body, forwards it to the engine's chat
completions, publishes the answer with the request's last message to the broker, and answers
once the broker acknowledged it. No chat parsing, no template, no tokens, no step record: the
added latency it shows is the HTTP hop plus the acknowledged publish, the floor under titoflow's.
Without ``--topic`` it publishes nothing: a plain pass-through, the HTTP hop alone.

    .venv/bin/python -m bench.floor_proxy --port 8001 --engine-url URL [--bootstrap HOST:PORT \
        --topic NAME]
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import uvicorn

from titoflow.bus import Publisher, create_topics
from titoflow.engine.http1 import Http1Client
from titoflow.settings import Settings

Scope = dict[str, Any]


class FloorProxy:
    def __init__(self, engine_url: str, settings: Settings, topic: str | None) -> None:
        self.settings = settings
        self.publisher = Publisher(settings)
        self.topic = topic
        self.http = Http1Client(engine_url)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, self._start, self._stop)
            return
        body = await read_body(receive)
        if scope["path"] != "/v1/chat/completions":
            await answer(send, 200, b'{"status":"ok"}')
            return
        session = orjson.loads(body)["messages"][-1].get("tool_call_id") or "floor"
        response = await self.http.request(
            "POST", "/v1/chat/completions", bytes(body), timeout_s=600
        )
        if self.topic is not None:
            await self.publisher.publish(self.topic, session, response.body + body[-400:])
        await answer(send, 200, response.body)

    async def _start(self) -> None:
        if self.topic is not None:
            await create_topics(self.settings, {self.topic: 1})
            await self.publisher.start()

    async def _stop(self) -> None:
        await self.publisher.stop()
        await self.http.close()


async def lifespan(
    receive: Any,
    send: Any,
    startup: Callable[[], Awaitable[None]],
    shutdown: Callable[[], Awaitable[None]],
) -> None:
    """ASGI's lifespan: ``startup`` before the server takes requests, ``shutdown`` as it stops."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Any) -> bytearray:
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def answer(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def stack_arguments(description: str) -> argparse.ArgumentParser:
    """The options every process on this stack takes: its port, the engine, the broker."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    return parser


def serve(app: Any, port: int) -> None:
    """``app`` on the ingress' stack: uvicorn on uvloop and httptools, no access log."""
    uvicorn.run(
        app, port=port, loop="uvloop", http="httptools", access_log=False, log_level="warning"
    )


def main() -> None:
    parser = stack_arguments(__doc__.splitlines()[0])
    parser.add_argument("--topic", help="publish each answer here; without it, nothing")
    args = parser.parse_args()
    settings = Settings(bootstrap_servers=args.bootstrap)
    serve(FloorProxy(args.engine_url.rstrip("/"), settings, args.topic), args.port)


if __name__ == "__main__":
    main()

"""A keep-alive HTTP/1.1 client for one origin (an engine), on asyncio protocols and httptools,
the parser uvicorn serves the ingress with.

Why not aiohttp: a whole ``VLLMEngine.generate`` against the engine double (body, call, parsed
answer) costs markedly less CPU and latency on this client (docs/benchmarks.md §1–2), for one
call the ingress makes every turn. It speaks only what engines answer: ``content-length`` or
chunked bodies, keep-alive, http or https; no redirects, cookies or compression.

Connections are reused while the server keeps them alive, and not once idle for
``IDLE_REUSE_S`` (uvicorn, vLLM's server, closes idle ones after 5 s). A request on a reused
connection that closes before any byte of the answer is sent once more on a new connection:
that is a server's idle close racing the request, which it never read. Failures raise
:class:`EngineConnectionError` (an ``OSError``) or ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlencode, urlsplit

import httptools

IDLE_REUSE_S = 4.0


class EngineConnectionError(ConnectionError):
    """The connection failed, closed early, or carried something that is not HTTP/1.1."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


class _Connection(asyncio.Protocol):
    """One connection; one exchange at a time. Body chunks go to ``chunks`` (a streamed answer)
    or are kept until the answer is complete (``finished``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = time.monotonic()
        self.status = 0
        self.got_bytes = False  # of the current answer
        self.headers_done: asyncio.Future[int] | None = None
        self.finished: asyncio.Future[bytes] | None = None
        self.chunks: asyncio.Queue[bytes | BaseException | None] | None = None
        self._body: list[bytes] = []

    # --- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small request/answer pairs stall on Nagle + delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(EngineConnectionError(f"not an HTTP/1.1 answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(EngineConnectionError(f"connection closed before the answer ended: {exc!r}"))

    # --- httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_result(self.status)

    def on_body(self, body: bytes) -> None:
        if self.chunks is not None:
            self.chunks.put_nowait(body)
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if not self.parser.should_keep_alive():
            self.close()
        if self.chunks is not None:
            self.chunks.put_nowait(None)
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(b"".join(self._body))
        self._body = []

    # ---
    def start(self, request: tuple[bytes, bytes], streamed: bool) -> asyncio.Future[Any]:
        """Send ``request`` (head, body); the future of the status (streamed) or of the whole
        body."""
        loop = asyncio.get_running_loop()
        self.got_bytes = False
        # Only what the caller awaits: a failed future nobody awaits is logged at exit.
        self.headers_done = loop.create_future() if streamed else None
        self.finished = None if streamed else loop.create_future()
        self.chunks = asyncio.Queue() if streamed else None
        assert self.transport is not None
        # Not joined: a long prompt's body is hundreds of KB, copied once more by a join
        # (uvloop writes both with one writev).
        self.transport.writelines(request)
        answer = self.headers_done or self.finished
        assert answer is not None
        return answer

    def _fail(self, exc: BaseException) -> None:
        for future in (self.headers_done, self.finished):
            if future is not None and not future.done():
                future.set_exception(exc)
        if self.chunks is not None:
            self.chunks.put_nowait(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1Client:
    """Requests to the origin of ``url`` (its path, if any, prefixes every request path)."""

    def __init__(self, url: str, connect_timeout_s: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        default_port = self.port == (443 if self.tls else 80)
        self._host_header = (self.host if default_port else f"{self.host}:{self.port}").encode()
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the one the idle ones belong to

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout_s: float,
        query: dict[str, str] | None = None,
    ) -> Response:
        """The whole answer, within ``timeout_s``."""
        message = self._message(method, path, body, query)
        async with asyncio.timeout(timeout_s):
            connection, content = await self._exchange(message, streamed=False, wait_s=None)
        self._release(connection)
        return Response(connection.status, content)

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, path: str, body: bytes | None = None, *, read_timeout_s: float
    ) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
        """The status and the body's chunks as they arrive; each wait is bounded by
        ``read_timeout_s`` (a long answer is fine while the server keeps sending)."""
        message = self._message(method, path, body, None)
        connection, status = await self._exchange(message, streamed=True, wait_s=read_timeout_s)
        ended = False

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal ended
            assert connection.chunks is not None
            while True:
                async with asyncio.timeout(read_timeout_s):
                    item = await connection.chunks.get()
                if item is None:
                    ended = True
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item

        try:
            yield status, chunks()
        finally:
            if ended:
                self._release(connection)
            else:  # left early: the rest of the answer would arrive on a reused connection
                connection.close()

    async def _exchange(
        self, message: tuple[bytes, bytes], streamed: bool, wait_s: float | None
    ) -> tuple[_Connection, Any]:
        """Send ``message`` on a kept connection, or a new one if the kept one turns out closed;
        the connection and the first of its answer (the status when streamed, else the body),
        waited for at most ``wait_s``."""
        for reused in self._attempts():
            connection = await self._connection(reused)
            answer = connection.start(message, streamed)
            try:
                async with asyncio.timeout(wait_s):
                    return connection, await answer
            except EngineConnectionError:
                if reused and not connection.got_bytes:
                    continue  # closed by the server while idle: it never read this one
                raise
            except BaseException:
                connection.close()  # cancelled or timed out: the answer may still come
                raise
        raise EngineConnectionError("unreachable: a new connection's attempt returns or raises")

    async def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def _attempts(self) -> tuple[bool, ...]:
        """Whether each attempt uses a kept connection: a kept one if there is one, then a
        new one."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a connection is bound to the loop that opened it
            self._idle.clear()
            self._loop = loop
        return (True, False) if self._take_idle(peek=True) else (False,)

    async def _connection(self, reused: bool) -> _Connection:
        if reused:
            kept = self._take_idle(peek=False)
            if kept is not None:
                return kept
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    _Connection,
                    self.host,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls else None,
                )
        except TimeoutError as exc:
            raise EngineConnectionError(
                f"no connection to {self.host}:{self.port} within {self.connect_timeout_s}s"
            ) from exc
        return connection

    def _take_idle(self, peek: bool) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle[-1]
            if not connection.closed and now - connection.idle_since < IDLE_REUSE_S:
                if not peek:
                    self._idle.pop()
                return connection
            self._idle.pop().close()
        return None

    def _release(self, connection: _Connection) -> None:
        if connection.closed:
            return
        connection.idle_since = time.monotonic()
        connection.headers_done = connection.finished = None
        connection.chunks = None
        self._idle.append(connection)

    def _message(
        self, method: str, path: str, body: bytes | None, query: dict[str, str] | None
    ) -> tuple[bytes, bytes]:
        """The request's head and body."""
        target = self.prefix + path + (f"?{urlencode(query)}" if query else "")
        head = f"{method} {target} HTTP/1.1\r\nhost: ".encode() + self._host_header
        if body is None:
            return head + b"\r\ncontent-length: 0\r\n\r\n", b""
        return (
            head
            + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n",
            body,
        )

"""The engine's HTTP/1.1 client against a real socket server: keep-alive reuse and its races,
chunked and streamed bodies, timeouts and early exits that must not leak an answer into the
next request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from titoflow.engine import http1
from titoflow.engine.http1 import EngineConnectionError, Http1Client


@dataclass
class Server:
    """Answers by path: ``/echo`` (method, target, host and body back), ``/chunked``, ``/close``
    (then closes), ``/slow`` (after 0.3 s), ``/stream`` (three chunks 50 ms apart)."""

    url: str = ""
    connections: int = 0
    requests: list[str] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                request_line, *lines = head.split("\r\n")
                headers = dict(line.split(": ", 1) for line in lines if ": " in line)
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                method, target, _ = request_line.split(" ")
                self.requests.append(target)
                await self.answer(writer, method, target, headers.get("host", ""), body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(
        self, writer: asyncio.StreamWriter, method: str, target: str, host: str, body: bytes
    ) -> None:
        path = target.split("?")[0]
        if path.endswith("/slow"):
            await asyncio.sleep(0.3)
        if path.endswith(("/chunked", "/stream")):
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in (b"data: one\n", b"data: two\n", b"data: three\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                if path.endswith("/stream"):
                    await asyncio.sleep(0.05)
            writer.write(b"0\r\n\r\n")
            return
        content = f"{method} {target} {host} ".encode() + body
        close = path.endswith("/close")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s"
            % (len(content), b"connection: close\r\n" if close else b"", content)
        )
        await writer.drain()
        if close:
            writer.close()

    def drop_idle_connections(self) -> None:
        """What uvicorn does to a keep-alive connection idle past its timeout."""
        for writer in self.writers:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    listener = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}/engine"
    async with listener:
        yield state


async def test_requests_reuse_one_connection_and_carry_prefix_query_and_body(
    server: Server,
) -> None:
    client = Http1Client(server.url)
    first = await client.request("POST", "/echo", b'{"a": 1}', timeout_s=5, query={"mode": "k"})
    second = await client.request("GET", "/echo", timeout_s=5)
    port = server.url.split(":")[2].split("/")[0]
    assert first == http1.Response(
        200, f'POST /engine/echo?mode=k 127.0.0.1:{port} {{"a": 1}}'.encode()
    )
    assert second.body.startswith(b"GET /engine/echo ")
    assert server.connections == 1
    await client.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced_transparently(
    server: Server,
) -> None:
    client = Http1Client(server.url)
    await client.request("GET", "/echo", timeout_s=5)
    server.drop_idle_connections()
    await asyncio.sleep(0.05)
    assert (await client.request("POST", "/echo", b"x", timeout_s=5)).status == 200
    server.drop_idle_connections()  # the client has not noticed yet: the request races the close
    assert (await client.request("POST", "/echo", b"y", timeout_s=5)).body.endswith(b" y")
    assert server.requests == ["/engine/echo"] * 3  # each request reached the server once
    await client.close()


async def test_connection_close_and_long_idle_connections_are_not_reused(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Http1Client(server.url)
    await client.request("GET", "/close", timeout_s=5)
    await client.request("GET", "/echo", timeout_s=5)
    assert server.connections == 2
    monkeypatch.setattr(http1, "IDLE_REUSE_S", 0.05)
    await asyncio.sleep(0.1)
    await client.request("GET", "/echo", timeout_s=5)
    assert server.connections == 3
    await client.close()


async def test_chunked_bodies_are_decoded_and_streams_arrive_as_sent(server: Server) -> None:
    client = Http1Client(server.url)
    whole = await client.request("GET", "/chunked", timeout_s=5)
    assert whole.body == b"data: one\ndata: two\ndata: three\n"
    async with client.stream("POST", "/stream", b"{}", read_timeout_s=5) as (status, chunks):
        assert status == 200
        assert [chunk async for chunk in chunks] == [
            b"data: one\n",
            b"data: two\n",
            b"data: three\n",
        ]
    assert server.connections == 1  # a stream read to its end leaves the connection reusable
    await client.close()


async def test_timeouts_and_abandoned_streams_never_leak_an_answer_into_the_next_request(
    server: Server,
) -> None:
    client = Http1Client(server.url)
    with pytest.raises(TimeoutError):
        await client.request("GET", "/slow", timeout_s=0.1)
    assert (await client.request("POST", "/echo", b"after", timeout_s=5)).body.endswith(b"after")
    async with client.stream("POST", "/stream", b"{}", read_timeout_s=5) as (_, chunks):
        async for _chunk in chunks:
            break  # leave after the first chunk
    assert (await client.request("POST", "/echo", b"next", timeout_s=5)).body.endswith(b"next")
    with pytest.raises(TimeoutError):
        async with client.stream("GET", "/slow", read_timeout_s=0.1):
            pass
    await client.close()


async def test_an_unreachable_origin_is_a_connection_error() -> None:
    client = Http1Client("http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(OSError):
        await client.request("GET", "/health", timeout_s=5)
    with pytest.raises(ValueError):
        Http1Client("unix:///tmp/engine.sock")
    assert issubclass(EngineConnectionError, OSError)

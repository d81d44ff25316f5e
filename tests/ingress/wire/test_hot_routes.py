"""The turn routes served straight from ASGI (``ingress/wire/hot_routes.py``) answer exactly as
FastAPI
answers them: the whole ingress (``create_app`` with a driver listener, on the SCRIPTED ENGINE
DOUBLE) with its hot routes, and the same ingress without them (the middleware taken out, so
FastAPI routes everything), are sent the same hypothesis-built requests (the edge fuzz's: every
turn route both ways, mutated and raw bodies, odd session ids and headers, other methods, the
wrong listener, bodies over the size limit) and must answer the same status, headers and body
(generated ids and clocks aside), streams included. A bug in a handler answers the same 500.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingress.wire.hot_routes import HotRoutes
from tests.support.edge_fuzz import (
    ENDPOINTS,
    SCAFFOLD_PORT,
    Case,
    Endpoint,
    cases,
    fuzz_app,
)

# The hot routes, and beside them routes FastAPI keeps (another method on a hot path, a FastAPI
# route under the same prefix, a driver route served the same way).
COMPARED = [
    e for e in ENDPOINTS if e.method == "POST" and not e.path.startswith(("/v1/sessions", "/admin"))
]
# Generated ids and clocks: the same request gets other ones on every call.
_VOLATILE = re.compile(
    rb'"(id|created|created_at|call_id|item_id|response_id|step_id|chain_id|at)"'
    rb':\s*("[^"]*"|\d+(\.\d+)?)'
    rb"|\d{4}-\d\d-\d\dT[0-9:.]+\+00:00"  # a time in a message
)


def ingress_app(hot: bool, limit: int) -> httpx2.AsyncClient:
    app, _, _ = fuzz_app(max_request_bytes=limit)
    ours = [m for m in app.user_middleware if m.cls is cast(object, HotRoutes)]
    assert len(ours) == 1, "the ingress serves its turn routes through HotRoutes"
    if not hot:
        app.user_middleware.remove(ours[0])
    transport = httpx2.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx2.AsyncClient(transport=transport, base_url="http://ingress")


@contextmanager
def both(limit: int = 64 * 1024) -> Iterator[tuple[asyncio.AbstractEventLoop, list[Any]]]:
    loop = asyncio.new_event_loop()
    clients = [ingress_app(True, limit), ingress_app(False, limit)]
    try:
        yield loop, clients
    finally:
        for client in clients:
            loop.run_until_complete(client.aclose())
        loop.close()


def answer(response: httpx2.Response) -> tuple[int, dict[str, str], bytes]:
    headers = dict(response.headers)
    body = _VOLATILE.sub(rb"*", response.content)
    if "content-length" in headers:  # an id's digits may differ in number
        headers["content-length"] = "*"
    return response.status_code, headers, body


async def compare(clients: list[httpx2.AsyncClient], case: Case) -> None:
    answers = []
    for client in clients:
        response = await client.request(
            case.method,
            f"http://ingress:{case.port}{case.path}",
            headers=case.headers,
            content=case.body,
            timeout=30,
        )
        answers.append(answer(response))
    assert answers[0] == answers[1], case


@pytest.fixture(scope="module")
def apps() -> Iterator[tuple[asyncio.AbstractEventLoop, list[Any]]]:
    with both() as pair:
        yield pair


@pytest.mark.parametrize("endpoint", COMPARED, ids=[e.label for e in COMPARED])
def test_the_hot_routes_answer_as_fastapi_does(
    apps: tuple[asyncio.AbstractEventLoop, list[httpx2.AsyncClient]], endpoint: Endpoint
) -> None:
    loop, clients = apps

    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=cases(endpoint), stream=st.booleans())
    def run(case: Case, stream: bool) -> None:
        if stream and case.body and case.body.startswith(b"{"):  # the same call, streamed
            case.body = b'{"stream": true, ' + case.body[1:]
        loop.run_until_complete(compare(clients, case))

    run()


def test_a_bug_in_a_hot_route_answers_as_fastapi_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception no handler expected: the same 500 in the API's shape from both."""

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr("ingress.wire.http.lower_headers", broken)
    with both() as (loop, clients):
        for path in ("/sess/s1/v1/chat/completions", "/v1/messages", "/generate"):
            case = Case("POST", path, SCAFFOLD_PORT, {b"x-session-id": b"s1"}, b"{}")
            loop.run_until_complete(compare(clients, case))
            status = loop.run_until_complete(clients[0].post(path, content=b"{}")).status_code
            assert status == 500

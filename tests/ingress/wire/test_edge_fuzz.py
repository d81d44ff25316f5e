"""Fuzz of the HTTP edge: every public endpoint of both listeners of the whole ingress
(``create_app`` with a driver listener, on the SCRIPTED ENGINE DOUBLE, its events and control
commands recorded; see ``tests/support/apps.py``), hit with hypothesis-built requests
(``tests/support/edge_fuzz.py``): bodies derived from the real request shapes and mutated
structurally (wrong types, missing and extra fields, huge, deep and unicode values, lone
surrogates, NaN, nulls), raw non-JSON bodies, bad headers, odd session ids, the wrong listener.

Held for every answer: no status of 500 or more (``/ready`` excepted: its 503 is what it says
while the broker and engine it probes are unreachable, as here); every error body in the shape
of its API (OpenAI's ``{"error": {...}}``, Anthropic's ``{"type": "error", ...}`` on
``/v1/messages``), with an error type that is not a server error's; every stream ends with its
API's end or its error event; and nothing published for a refused request.

Each endpoint runs a bounded number of examples (derandomized under CI, see conftest.py); the
cases and statuses per endpoint are printed at the end of the module (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.doubles import RecordingBus, RecordingPublisher
from tests.support.edge_fuzz import ENDPOINTS, Case, Endpoint, cases, fuzz_app

EXAMPLES = 150  # per endpoint: the module runs in about a minute on the 2-core CI machine


# --- what is held ------------------------------------------------------------------------------


def check_error_body(path: str, status: int, body: Any) -> None:
    if "/v1/messages" in path:
        assert body["type"] == "error" and set(body) == {"type", "error"}, body
        error = body["error"]
        assert isinstance(error["type"], str) and isinstance(error["message"], str), body
        assert error["message"] and error["type"] != "api_error", body
        return
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["type"] != "server_error", body
    assert error["param"] is None or isinstance(error["param"], str), body
    assert error["code"] is None or isinstance(error["code"], str), body


# What a complete stream of each API ends with.
STREAM_ENDS = (
    "data: [DONE]",
    "event: message_stop",
    "event: response.completed",
    "event: response.incomplete",
)
SERVER_ERRORS = {"api_error", "server_error", "internal_error"}


def check_stream(text: str) -> None:
    """A stream ends complete or with its API's error event (chat: ``{"error": {...}}``,
    Anthropic: ``{"type": "error", "error": {...}}``, Responses: flat), never a server's."""
    last = text.rstrip().rsplit("\n\n", 1)[-1]
    if last.startswith(STREAM_ENDS):
        return
    assert "data: " in last, text[-500:]
    payload = json.loads(last.split("data: ", 1)[1])
    error = payload.get("error") or payload
    assert payload.get("type") == "error" or "error" in payload, text[-500:]
    assert not {error.get("type"), error.get("code")} & SERVER_ERRORS, payload


@dataclass
class Ingress:
    loop: asyncio.AbstractEventLoop  # its own: each hypothesis example is a synchronous call
    client: httpx2.AsyncClient
    publisher: RecordingPublisher
    bus: RecordingBus
    label: str  # of its counts, before each endpoint's
    statuses: dict[str, Counter[int]]


@contextmanager
def fuzzed_ingress(label: str = "", **overrides: Any) -> Iterator[Ingress]:
    """The fuzzed app (``overrides``: settings), its cases counted under ``label``."""
    app, publisher, bus = fuzz_app(**{"max_request_bytes": 2 * 1024 * 1024, **overrides})
    # A bug answers 500 instead of surfacing here as an exception: the status is the finding.
    transport = httpx2.ASGITransport(app=app, raise_app_exceptions=False)
    client = httpx2.AsyncClient(transport=transport, base_url="http://ingress")
    loop = asyncio.new_event_loop()
    try:
        yield Ingress(loop, client, publisher, bus, label, {})
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


def report(statuses: dict[str, Counter[int]]) -> str:
    lines = ["edge fuzz: cases and statuses per endpoint"]
    for label, counts in statuses.items():
        spread = ", ".join(f"{status}: {n}" for status, n in sorted(counts.items()))
        lines.append(f"  {label:<44} {sum(counts.values()):>5}  {spread}")
    total = sum(sum(counts.values()) for counts in statuses.values())
    lines.append(f"  {'all':<44} {total:>5}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def ingress() -> Iterator[Ingress]:
    with fuzzed_ingress() as fuzzed:
        yield fuzzed
        print("\n" + report(fuzzed.statuses))


@pytest.fixture(scope="module")
def keyed_ingress() -> Iterator[Ingress]:
    """Session keys on: every scaffold call needs its session's key and names no other."""
    with fuzzed_ingress("keys: ", implicit_sessions=False) as fuzzed:
        yield fuzzed
        print("\n" + report(fuzzed.statuses))


async def send(ingress: Ingress, endpoint: Endpoint, case: Case) -> None:
    before = len(ingress.publisher.events), len(ingress.bus.records)
    response = await ingress.client.request(
        case.method,
        f"http://ingress:{case.port}{case.path}",
        headers=case.headers,
        content=case.body,
        timeout=30,
    )
    status = response.status_code
    ingress.statuses.setdefault(ingress.label + endpoint.label, Counter())[status] += 1
    if endpoint.path == "/ready" and status == 503:
        assert set(response.json()) == {"tokenizer", "broker", "engine"}
        return
    assert status < 500, (case, status, response.text[:2000])
    if status >= 400:
        assert (len(ingress.publisher.events), len(ingress.bus.records)) == before, case
        if case.method != "HEAD":
            check_error_body(case.path, status, response.json())
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        check_stream(response.text)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.label for e in ENDPOINTS])
def test_no_request_gets_a_5xx_or_an_error_out_of_shape(
    ingress: Ingress, endpoint: Endpoint
) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=cases(endpoint))
    def run(case: Case) -> None:
        ingress.loop.run_until_complete(send(ingress, endpoint, case))

    run()


SESSION_CALLS = [e for e in ENDPOINTS if e.plane == "scaffold" and e.seed is not None]


@pytest.mark.parametrize("endpoint", SESSION_CALLS, ids=[e.label for e in SESSION_CALLS])
def test_with_session_keys_no_request_gets_a_5xx_or_an_error_out_of_shape(
    keyed_ingress: Ingress, endpoint: Endpoint
) -> None:
    @settings(
        max_examples=EXAMPLES // 3,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=cases(endpoint, keyed=True))
    def run(case: Case) -> None:
        keyed_ingress.loop.run_until_complete(send(keyed_ingress, endpoint, case))

    run()

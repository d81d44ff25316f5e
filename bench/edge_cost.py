"""The HTTP edge's work per request on what real scaffolds send: reading the body
(``ingress.http.read_json``: parsing, the size and depth bounds) and parsing it into a turn
(each adapter's ``parse_request``: validation, tool and session checks), for the captured
requests of bench/captures (Claude Code, Codex, OpenCode) and a long Claude Code history (its
messages repeated to 200). Messages are parsed once before timing, as a replica has parsed a
re-sent history (``ingress.known_messages``).

    .venv/bin/python bench/edge_cost.py [--repeat 400] [--rounds 15]
    PYTHONPATH=/other/checkout .venv/bin/python bench/edge_cost.py   # the same on another checkout

Prints CPU µs per request per body: the least over rounds of the mean over ``--repeat`` calls
(the least: a shared machine only ever adds).
Uses only what every checkout since issue 25 has (``read_json``, ``parse_request``), so one file
measures a change's before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi import Request

from ingress import anthropic_messages, http, openai_chat, openai_responses
from titoflow.settings import Settings

CAPTURES = Path(__file__).parent / "captures"
PARSERS = {
    "messages": anthropic_messages.parse_request,
    "chat-completions": openai_chat.parse_request,
    "responses": openai_responses.parse_request,
}


def bodies() -> dict[str, tuple[bytes, Any]]:
    """Each capture's body (raw, and its parser), plus Claude Code's with 200 messages."""
    out = {}
    for path in sorted(CAPTURES.glob("*/*.json")):
        body = json.loads(path.read_text())["body"]
        parser = next(p for kind, p in PARSERS.items() if path.stem.endswith(kind))
        out[f"{path.parent.name}/{path.stem[:3]}"] = (json.dumps(body).encode(), parser)
        if path.parent.name == "claude-default" and path.stem.startswith("002"):
            messages = body["messages"]
            long = {**body, "messages": (messages * (200 // len(messages) + 1))[:200]}
            out["claude-default/200-messages"] = (json.dumps(long).encode(), parser)
    return out


def request_for(raw: bytes, settings: Settings) -> Request:
    app = SimpleNamespace(state=SimpleNamespace(settings=settings))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "query_string": b"",
        "headers": [(b"content-length", str(len(raw)).encode())],
        "app": app,
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    return Request(scope, receive)


async def edge(raw: bytes, parser: Any, settings: Settings) -> None:
    body = await http.read_json(request_for(raw, settings))
    parser(body, "s1", {})


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    settings = Settings()
    cases = bodies()
    for raw, parse in cases.values():  # known messages, as on a replica
        await edge(raw, parse, settings)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleaved: each body meets the machine as the others do
        for name, (raw, parse) in cases.items():
            started = time.process_time()
            for _ in range(args.repeat):
                await edge(raw, parse, settings)
            times[name].append((time.process_time() - started) / args.repeat * 1e6)
    print(f"{'body':<32} {'bytes':>8} {'µs/request':>11}")
    for name, (raw, _) in cases.items():
        print(f"{name:<32} {len(raw):>8} {min(times[name]):>11.1f}")


if __name__ == "__main__":
    asyncio.run(main())

"""The HTTP edge's work per request on what real scaffolds send: reading the body
(``ingress.wire.http.read_json``: parsing, the size and depth bounds) and parsing it into a turn
(each adapter's ``parse_request``: validation, tool and session checks).

    .venv/bin/python -m bench.edge_cost [--repeat 200] [--rounds 7] [--against PATH]

The bodies are the captured requests of bench/captures (Claude Code, Codex, OpenCode) and a
long Claude Code history (its messages repeated to 200). Messages are parsed once before timing,
as a replica has parsed a re-sent history (``ingress.wire.known_messages``). A round runs in a child
process with the measured checkout first on the path and reports, per body, the CPU µs per
request over ``--repeat`` calls; the figure is the median over rounds. With ``--against`` the
same rounds run, interleaved, on another checkout (e.g. a git worktree of the previous main;
it needs only ``read_json`` and ``parse_request``, not this file), and the ratio is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench.harness import ROOT, command_line, write_results

ROUND = """
import asyncio, json, sys, time
from pathlib import Path
from types import SimpleNamespace
from fastapi import Request
from ingress.turns.turn import SessionRef
from ingress.wire import anthropic_messages, http, openai_chat, openai_responses
from titoflow.settings import Settings

captures, repeat = Path(sys.argv[1]), int(sys.argv[2])
parsers = {
    "messages": anthropic_messages.parse_request,
    "chat-completions": openai_chat.parse_request,
    "responses": openai_responses.parse_request,
}
cases = {}
for path in sorted(captures.glob("*/*.json")):
    body = json.loads(path.read_text())["body"]
    parse = next(p for kind, p in parsers.items() if path.stem.endswith(kind))
    cases[f"{path.parent.name}/{path.stem[:3]}"] = (json.dumps(body).encode(), parse)
    if path.parent.name == "claude-default" and path.stem.startswith("002"):
        messages = body["messages"]
        long = {**body, "messages": (messages * (200 // len(messages) + 1))[:200]}
        cases["claude-default/200-messages"] = (json.dumps(long).encode(), parse)
app = SimpleNamespace(state=SimpleNamespace(settings=Settings()))

async def edge(raw, parse):
    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}
    headers = [(b"content-length", str(len(raw)).encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "app": app}
    parse(await http.read_json(Request(scope, receive)), SessionRef(session_id="s1"))

async def main():
    for raw, parse in cases.values():  # known messages, as on a replica
        await edge(raw, parse)
    out = {}
    for name, (raw, parse) in cases.items():
        started = time.process_time()
        for _ in range(repeat):
            await edge(raw, parse)
        out[name] = [len(raw), (time.process_time() - started) / repeat * 1e6]
    print(json.dumps(out))

asyncio.run(main())
"""


def measure_in(checkout: str, repeat: int) -> dict[str, list[float]]:
    """Per body, its bytes and CPU µs per request, of one round on ``checkout``'s code."""
    env = {**os.environ, "PYTHONPATH": checkout}
    argv = [str(ROOT / "bench" / "captures"), str(repeat)]
    out = subprocess.run(
        [sys.executable, "-c", ROUND, *argv], cwd=checkout, env=env, check=True, capture_output=True
    )
    result: dict[str, list[float]] = json.loads(out.stdout.decode().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", default="", help="another checkout to measure alike")
    parser.add_argument("--name", default="edge_cost")
    args = parser.parse_args()
    here: list[dict[str, list[float]]] = []
    there: list[dict[str, list[float]]] = []
    for _ in range(args.rounds):  # interleaved: both checkouts meet the machine alike
        here.append(measure_in(str(ROOT), args.repeat))
        if args.against:
            there.append(measure_in(args.against, args.repeat))
    rows = []
    lines = [f"{'body':<28} {'bytes':>7} {'µs/request':>10} {'--against':>10} {'ratio':>6}"]
    for name, (size, _) in here[0].items():
        us = statistics.median(r[name][1] for r in here)
        row: dict[str, object] = {"body": name, "bytes": size, "us": us}
        line = f"{name:<28} {size:>7.0f} {us:>10.1f}"
        if there:
            against = statistics.median(r[name][1] for r in there)
            row.update(against_us=against, ratio=round(us / against, 3))
            line += f" {against:>10.1f} {us / against:>6.3f}"
        rows.append(row)
        lines.append(line)
    write_results(args.name, command_line(), {"rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()

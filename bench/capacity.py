"""Capacity model: per-unit figures measured on one ingress and one worker, the model's table
for 1k / 10k / 100k concurrent sessions, and a check of the model's prediction at a large load.

    .venv/bin/python -m bench.capacity [--burst 200] [--unit-sessions 500] [--sessions 2000] \
        [--turns 4] [--period 40] [--turn-every 30] [--context 32000] [--session-turns 50]

Everything runs on real tansu with one real ingress and one real worker process, and the
SCRIPTED ENGINE DOUBLE (``bench/engine_double.py``: zero latency, canned tool calls) as the
engine, so the figures are titoflow's own cost, not generation's. Sessions are
``bench/overhead.py``'s agent sessions (a 32-token reply with a tool call, a 300-character tool
result per turn) through the OpenAI chat endpoint.

1. Unit figures. Saturated: ``--burst`` sessions of ``--turns`` turns, 32 at once, then
   finalized: turns/s per ingress core and steps/s per worker core (process CPU over the run,
   less the processes' idle CPU), and both topics read back: bytes per token on ``steps`` (per
   new token a step carries) and on ``segments`` (per token of a segment). Paced as the check
   is (``--unit-sessions`` sessions, below): ingress CPU per turn and worker CPU per step when
   little queues (so little batches: several times the saturated cost per step in the worker,
   whose every batch fetches, commits and publishes), and RSS growth per open session in each
   (the sessions stay open, so the worker holds them all).
2. The check: ``--sessions`` more sessions on the same processes, paced (open loop): each takes
   a turn every ``--period`` seconds, starts spread over the period. The model predicts, from
   the unit figures, the turns/s held, ingress and worker CPU, their RSS after, and the bytes on
   ``steps``; the bench measures each and prints predicted, measured and their ratio.
3. The model's table: for 1k / 10k / 100k concurrent sessions each taking a turn every
   ``--turn-every`` seconds, ``--session-turns`` turns reaching ``--context`` tokens: ingress
   replicas and workers at ``UTILISATION`` of a core each, partitions, broker write throughput
   and disk per day (replication ``REPLICATION``), memory per replica and per worker. Memory per
   session is scaled to the stated context by tokens held (the unit sessions hold fewer), and
   CPU per turn is the unit run's, whose requests are shorter than a 32k-token session's (the
   ingress parses each request's whole history, so longer histories cost more per turn).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from bench.harness import command_line, group_cpu_seconds, rss_bytes, start_double, write_results
from bench.memory import _open_sessions
from bench.overhead import ChatSessions, Workload, _client, drive, no_meter
from bench.pipeline import wait_assigned
from cli.dev.broker import start_tansu
from cli.dev.procs import ManagedProcess, free_port
from cli.dev.stack import start_ingress, start_worker
from schemas.events import SegmentFinalized, StepRecorded
from titoflow.bus import ensure_topics, make_consumer
from titoflow.settings import Settings

UTILISATION = 0.6  # of a core per ingress replica or worker: headroom for bursts and p99
REPLICATION = 3  # the broker's replication factor in production (operations.md)
CONCURRENCY = 32  # unit run: turns in flight at once
IN_FLIGHT = 64  # the paced check's bound on turns in flight


@dataclass
class Stack:
    settings: Settings
    ingress: ManagedProcess
    url: str
    worker: ManagedProcess
    worker_metrics: str

    def cpu(self) -> tuple[float, float]:
        return group_cpu_seconds(self.ingress.pid), group_cpu_seconds(self.worker.pid)

    def idle_cores(self, seconds: float = 5.0) -> tuple[float, float]:
        """Each process's CPU with no load (polls, ticks), in cores."""
        before = self.cpu()
        time.sleep(seconds)
        after = self.cpu()
        return (after[0] - before[0]) / seconds, (after[1] - before[1]) / seconds

    def rss(self) -> tuple[int, int]:
        return rss_bytes(self.ingress.pid), rss_bytes(self.worker.pid)

    def wait_worker(self, open_sessions: int) -> None:
        """Until the worker holds ``open_sessions`` sessions and has consumed every step."""

        def caught_up() -> bool:
            text = httpx.get(self.worker_metrics, timeout=5).text
            lag = sum(
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("titoflow_worker_consumer_lag{")
            )
            return _open_sessions(self.worker_metrics) >= open_sessions and lag == 0

        self.worker.wait_until(caught_up, 900, f"{open_sessions} open sessions, no lag")


def sessions_of(stack: Stack, prefix: str, workload: Workload) -> ChatSessions:
    return ChatSessions(
        workload, lambda s: f"{stack.url}/sess/{prefix}-{s}/v1/chat/completions", "m"
    )


async def finalize(stack: Stack, prefix: str, sessions: int) -> None:
    async with _client(CONCURRENCY) as client:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(s: int) -> None:
            async with gate:
                (
                    await client.post(f"{stack.url}/sess/{prefix}-{s}/finalize", json={})
                ).raise_for_status()

        await asyncio.gather(*(one(s) for s in range(sessions)))


async def topic_bytes(
    settings: Settings, topic: Literal["steps", "segments"], prefix: str
) -> tuple[int, int, int]:
    """(records, value bytes, tokens) of ``prefix``'s sessions on ``topic``: the tokens a step
    adds (prompt tail + completion) or a segment's tokens."""
    consumer = make_consumer(
        settings, settings.topic(topic), group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    records = size = tokens = 0
    try:
        idle = 0
        while idle < 3:
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            idle = 0 if batch else idle + 1
            for record in (r for rs in batch.values() for r in rs):
                value = record.value or b""
                if topic == "steps" and b'"step_recorded"' in value:
                    step = StepRecorded.model_validate_json(value)
                    if step.session_id.startswith(prefix):
                        records, size = records + 1, size + len(value)
                        tokens += len(step.prompt_tail_ids) + len(step.completion_ids)
                elif topic == "segments" and b'"segment_finalized"' in value:
                    segment = SegmentFinalized.model_validate_json(value)
                    if segment.session_id.startswith(prefix):
                        records, size = records + 1, size + len(value)
                        tokens += len(segment.token_ids)
    finally:
        await consumer.stop()
    return records, size, tokens


def busy(cpu_s: float, idle_cores: float, wall_s: float) -> float:
    """CPU seconds spent on the load: ``cpu_s`` less idle CPU over ``wall_s``, at least one
    clock tick (what /proc counts in), so a tiny run does not divide by zero."""
    return max(cpu_s - idle_cores * wall_s, 0.01)


def unit_figures(
    stack: Stack, burst: int, sessions: int, turns: int, period: float
) -> dict[str, float]:
    prefix = f"u{uuid.uuid4().hex[:6]}"
    warm = Workload(8, turns, 32, 300, None)
    asyncio.run(drive([sessions_of(stack, f"w{prefix}", warm).turn], [no_meter], warm, 8))
    stack.wait_worker(8)
    idle = stack.idle_cores()
    # Saturated: what a core holds when requests and steps queue (and so batch).
    workload = Workload(burst, turns, 32, 300, None)
    cpu0 = stack.cpu()
    started = time.perf_counter()
    asyncio.run(
        drive([sessions_of(stack, f"b{prefix}", workload).turn], [no_meter], workload, CONCURRENCY)
    )
    stack.wait_worker(8 + burst)
    wall = time.perf_counter() - started
    cpu1 = stack.cpu()
    asyncio.run(finalize(stack, f"b{prefix}", burst))
    steps = asyncio.run(topic_bytes(stack.settings, "steps", f"b{prefix}"))
    segments = asyncio.run(topic_bytes(stack.settings, "segments", f"b{prefix}"))
    # Paced as the check is: CPU per turn when little queues, memory per open session.
    cpu2, rss2 = stack.cpu(), stack.rss()
    started = time.perf_counter()
    asyncio.run(paced(stack, f"p{prefix}", Workload(sessions, turns, 32, 300, None), period))
    stack.wait_worker(8 + sessions)
    took = time.perf_counter() - started
    cpu3, rss3 = stack.cpu(), stack.rss()
    count, paced_count = burst * turns, sessions * turns
    return {
        "ingress_idle_cores": idle[0],
        "worker_idle_cores": idle[1],
        "ingress_turns_per_s_per_core": count / busy(cpu1[0] - cpu0[0], idle[0], wall),
        "worker_steps_per_s_per_core": count / busy(cpu1[1] - cpu0[1], idle[1], wall),
        "ingress_cpu_ms_per_turn": busy(cpu3[0] - cpu2[0], idle[0], took) / paced_count * 1e3,
        "worker_cpu_ms_per_step": busy(cpu3[1] - cpu2[1], idle[1], took) / paced_count * 1e3,
        "ingress_kb_per_session": (rss3[0] - rss2[0]) / sessions / 1024,
        "worker_kb_per_session": (rss3[1] - rss2[1]) / sessions / 1024,
        "tokens_per_turn": steps[2] / steps[0],
        "tokens_per_session": steps[2] / burst,
        "steps_bytes_per_token": steps[1] / steps[2],
        "segments_bytes_per_token": segments[1] / segments[2],
        "segments_per_session": segments[0] / burst,
    }


async def paced(stack: Stack, prefix: str, workload: Workload, period: float) -> float:
    """Each session takes a turn every ``period`` s, starts spread over it; the wall time from
    the first scheduled turn to the last answer."""
    chat = sessions_of(stack, prefix, workload)
    sessions = workload.sessions
    # Few requests in flight: httpx's pool scans its queue per request, so thousands queued
    # would make the client, not the stack, the bottleneck.
    gate = asyncio.Semaphore(IN_FLIGHT)
    async with _client(IN_FLIGHT) as client:
        start = time.perf_counter() + 1.0

        async def session(s: int) -> None:
            for t in range(workload.turns):
                delay = start + t * period + s * period / sessions - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                async with gate:
                    await chat.turn(client, s, t)

        await asyncio.gather(*(session(s) for s in range(sessions)))
        return time.perf_counter() - start


def check(
    stack: Stack, unit: dict[str, float], sessions: int, turns: int, period: float
) -> list[dict[str, Any]]:
    prefix = f"c{uuid.uuid4().hex[:6]}"
    open_before = round(_open_sessions(stack.worker_metrics))
    cpu0, rss0 = stack.cpu(), stack.rss()
    workload = Workload(sessions, turns, 32, 300, None)
    started = time.perf_counter()
    wall = asyncio.run(paced(stack, prefix, workload, period))
    stack.wait_worker(open_before + sessions)
    cpu1, rss1 = stack.cpu(), stack.rss()
    took = time.perf_counter() - started
    steps = asyncio.run(topic_bytes(stack.settings, "steps", prefix))
    count = sessions * turns
    offered_wall = turns * period  # the schedule's span: the last turn starts near its end
    rows = [
        ("turns/s held", count / offered_wall, count / wall),
        ("ingress CPU s", cpu_s(unit, "ingress", count, took), cpu1[0] - cpu0[0]),
        ("worker CPU s", cpu_s(unit, "worker", count, took), cpu1[1] - cpu0[1]),
        (
            "ingress RSS MB",
            (rss0[0] + sessions * unit["ingress_kb_per_session"] * 1024) / 2**20,
            rss1[0] / 2**20,
        ),
        (
            "worker RSS MB",
            (rss0[1] + sessions * unit["worker_kb_per_session"] * 1024) / 2**20,
            rss1[1] / 2**20,
        ),
        (
            "steps topic MB",
            count * unit["tokens_per_turn"] * unit["steps_bytes_per_token"] / 2**20,
            steps[1] / 2**20,
        ),
    ]
    return [
        {
            "figure": name,
            "predicted": round(p, 2),
            "measured": round(m, 2),
            "ratio": round(m / p, 3),
        }
        for name, p, m in rows
    ]


def cpu_s(unit: dict[str, float], process: str, count: int, wall: float) -> float:
    """The model's CPU seconds of ``process`` for ``count`` turns (steps) over ``wall`` s."""
    per = unit["ingress_cpu_ms_per_turn" if process == "ingress" else "worker_cpu_ms_per_step"]
    return unit[f"{process}_idle_cores"] * wall + count * per / 1e3


def model(
    unit: dict[str, float], sessions: int, turn_every: float, context: int, session_turns: int
) -> dict[str, Any]:
    """What ``sessions`` concurrent sessions need, each taking a turn every ``turn_every`` s and
    reaching ``context`` tokens in ``session_turns`` turns."""
    turns_s = sessions / turn_every
    ingress_cores = turns_s * unit["ingress_cpu_ms_per_turn"] / 1e3
    worker_cores = turns_s * unit["worker_cpu_ms_per_step"] / 1e3
    replicas = max(1, math.ceil(ingress_cores / (UTILISATION - unit["ingress_idle_cores"])))
    workers = max(1, math.ceil(worker_cores / (UTILISATION - unit["worker_idle_cores"])))
    # At the saturated cost (requests and steps batch as the load per process grows): the
    # least that could do, where the paced cost above is the most.
    least = (
        math.ceil(turns_s / unit["ingress_turns_per_s_per_core"] / UTILISATION),
        math.ceil(turns_s / unit["worker_steps_per_s_per_core"] / UTILISATION),
    )
    partitions = 2 ** math.ceil(math.log2(2 * workers))  # workers can double without re-keying
    steps_bps = turns_s * context / session_turns * unit["steps_bytes_per_token"]
    ends_s = sessions / (turn_every * session_turns)
    segments_bps = (
        ends_s * context * unit["segments_bytes_per_token"] * unit["segments_per_session"]
    )
    # Memory scales with the tokens a session holds; the unit sessions held fewer.
    scale = context / 2 / unit["tokens_per_session"]  # on average a session is half-way through
    return {
        "sessions": sessions,
        "turns_per_s": round(turns_s),
        "ingress_replicas": replicas,
        "workers": workers,
        "at_saturated_cost": f"{least[0]}/{least[1]}",
        "partitions": partitions,
        "broker_write_mb_s": round((steps_bps + segments_bps) / 2**20, 1),
        "disk_gb_per_day": round((steps_bps + segments_bps) * 86400 * REPLICATION / 2**30),
        "ingress_mb_per_replica": round(
            sessions / replicas * unit["ingress_kb_per_session"] * scale / 1024
        ),
        "worker_mb_per_worker": round(
            sessions / workers * unit["worker_kb_per_session"] * scale / 1024
        ),
    }


def start(log_dir: Path, bootstrap: str, engine_url: str, sessions: int) -> Stack:
    run_id = uuid.uuid4().hex[:8]
    settings = Settings(
        bootstrap_servers=bootstrap,
        engine_url=engine_url,
        topic_prefix=f"cap-{run_id}",
        worker_group=f"cap-{run_id}",
        session_cache_size=sessions * 2,
        idle_finalize_s=3600,
        worker_metrics_port=free_port(),
    )
    asyncio.run(ensure_topics(settings))
    worker = start_worker(settings, log_dir, f"worker-{run_id}")
    asyncio.run(wait_assigned([worker], settings.steps_partitions, 120))
    ingress, url = start_ingress(settings, log_dir, f"ingress-{run_id}")
    metrics = f"http://{settings.ingress_host}:{settings.worker_metrics_port}/metrics"
    return Stack(settings, ingress, url, worker, metrics)


def table(
    unit: dict[str, float], checked: list[dict[str, Any]], models: list[dict[str, Any]], load: str
) -> str:
    lines = ["unit figures (one ingress, one worker, engine double, tansu):"]
    lines += [f"  {k:<26} {round(v, 3)}" for k, v in unit.items()]
    lines.append(f"check at load ({load}):")
    lines.append(f"  {'figure':<16} {'predicted':>10} {'measured':>10} {'ratio':>6}")
    lines += [
        f"  {r['figure']:<16} {r['predicted']:>10} {r['measured']:>10} {r['ratio']:>6}"
        for r in checked
    ]
    lines.append("model:")
    keys = list(models[0])
    lines.append("  " + " ".join(f"{k:>{max(len(k), 8)}}" for k in keys))
    lines += ["  " + " ".join(f"{m[k]!s:>{max(len(k), 8)}}" for k in keys) for m in models]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=200, help="saturated unit run's sessions")
    parser.add_argument("--unit-sessions", type=int, default=500, help="paced unit run's")
    parser.add_argument("--sessions", type=int, default=2000, help="the check's load")
    parser.add_argument("--turns", type=int, default=4, help="turns per bench session")
    parser.add_argument("--period", type=float, default=40, help="s between a session's turns")
    parser.add_argument("--turn-every", type=float, default=30, help="model: s between turns")
    parser.add_argument("--context", type=int, default=32000, help="model: tokens at the end")
    parser.add_argument("--session-turns", type=int, default=50, help="model: turns per session")
    parser.add_argument("--name", default="capacity")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="titoflow-bench-") as tmp:
        log_dir = Path(tmp)
        broker, bootstrap = start_tansu(log_dir)
        double, engine_url = start_double(log_dir, Settings().model_path)
        stack: Stack | None = None
        try:
            cached = args.burst + args.unit_sessions + args.sessions + 8
            stack = start(log_dir, bootstrap, engine_url, cached)
            load0 = Path("/proc/loadavg").read_text().split()[0]
            unit = unit_figures(stack, args.burst, args.unit_sessions, args.turns, args.period)
            print(unit, flush=True)
            checked = check(stack, unit, args.sessions, args.turns, args.period)
            load1 = Path("/proc/loadavg").read_text().split()[0]
        finally:
            for proc in (stack.ingress, stack.worker) if stack else ():
                with contextlib.suppress(Exception):
                    proc.stop()
            double.stop()
            broker.stop()
    models = [
        model(unit, n, args.turn_every, args.context, args.session_turns)
        for n in (1000, 10000, 100000)
    ]
    load = (
        f"{args.sessions} sessions × {args.turns} turns, a turn every {args.period} s; "
        f"load average {load0} → {load1}"
    )
    data = {"unit": unit, "check": checked, "model": models, "load": load, "args": vars(args)}
    write_results(args.name, command_line(), data, table(unit, checked, models, load))


if __name__ == "__main__":
    main()

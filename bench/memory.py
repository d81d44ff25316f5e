"""Ingress RSS per cached session and worker RSS per open session, at 1k and 10k sessions.

    .venv/bin/python -m bench.memory [--sessions 1000 10000] [--turns 2] [--tokens 1000]

Ingress: sessions of ``--turns`` agent turns (``bench/overhead.py``'s workload) through a real
ingress on the ZERO-LATENCY ENGINE DOUBLE and tansu, with a session cache big enough to keep
them all; RSS growth of the ingress process over the sessions / sessions. Worker: sessions of
``--steps`` steps of ``--tokens`` tokens each (``bench/pipeline.py``'s events) published without
a finalize, so every one stays open in the worker; RSS growth / sessions. Each count starts a
fresh process, so the figures do not include what an earlier count left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.harness import command_line, rss_bytes, start_double, write_results
from bench.overhead import ChatSessions, Workload, drive, no_meter
from bench.pipeline import session_events, wait_assigned, worker_topics
from cli.dev.broker import start_tansu
from cli.dev.procs import free_port
from cli.dev.stack import start_ingress, start_worker
from titoflow.bus import Publisher
from titoflow.settings import Settings


def ingress_rss(
    bootstrap: str, engine_url: str, log_dir: Path, sessions: int, turns: int
) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    settings = Settings(
        bootstrap_servers=bootstrap,
        engine_url=engine_url,
        topic_prefix=f"bench-{run_id}",
        session_cache_size=sessions * 2,
    )
    proc, url = start_ingress(settings, log_dir, f"ingress-{run_id}")
    try:
        workload = Workload(sessions, turns, 32, 300, None)
        chat = ChatSessions(
            workload, lambda s: f"{url}/sess/m-{run_id}-{s}/v1/chat/completions", "m"
        )
        warm = ChatSessions(
            workload, lambda s: f"{url}/sess/w-{run_id}-{s}/v1/chat/completions", "m"
        )
        asyncio.run(drive([warm.turn], [no_meter], Workload(8, turns, 32, 300, None), 8))
        before = rss_bytes(proc.pid)
        asyncio.run(drive([chat.turn], [no_meter], workload, 32))
        after = rss_bytes(proc.pid)
    finally:
        proc.stop()
    return _row("ingress", sessions, before, after, f"{turns} turns each")


def worker_rss(
    bootstrap: str, log_dir: Path, sessions: int, steps: int, tokens: int
) -> dict[str, Any]:
    run_id, settings = worker_topics(bootstrap, worker_metrics_port=free_port())
    proc = start_worker(settings, log_dir, f"worker-{run_id}")
    try:
        asyncio.run(wait_assigned([proc], settings.steps_partitions, 120))
        before = rss_bytes(proc.pid)
        asyncio.run(_publish_open(settings, run_id, sessions, steps, tokens))
        metrics = f"http://{settings.ingress_host}:{settings.worker_metrics_port}/metrics"
        proc.wait_until(lambda: _open_sessions(metrics) >= sessions, 600, "all sessions open")
        after = rss_bytes(proc.pid)
    finally:
        proc.stop()
    return _row("worker", sessions, before, after, f"{steps} steps × {tokens} tokens each")


async def _publish_open(
    settings: Settings, run_id: str, sessions: int, steps: int, tokens: int
) -> None:
    publisher = Publisher(settings)
    await publisher.start()
    topic = settings.topic("steps")
    try:
        for start in range(0, sessions, 500):
            records = [
                (f"o-{run_id}-{i}", e.model_dump_json().encode())
                for i in range(start, min(start + 500, sessions))
                for e in session_events(f"o-{run_id}-{i}", steps, tokens, seed=i)
            ]
            await asyncio.gather(*(publisher.publish(topic, k, v) for k, v in records))
    finally:
        await publisher.stop()


def _open_sessions(metrics_url: str) -> float:
    for line in httpx.get(metrics_url, timeout=5).text.splitlines():
        if line.startswith("titoflow_worker_open_sessions "):
            return float(line.split()[1])
    return 0.0


def _row(process: str, sessions: int, before: int, after: int, shape: str) -> dict[str, Any]:
    return {
        "process": process,
        "sessions": sessions,
        "session_shape": shape,
        "rss_before_mb": round(before / 2**20, 1),
        "rss_after_mb": round(after / 2**20, 1),
        "kb_per_session": round((after - before) / sessions / 1024, 2),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'process':<8} {'sessions':>8} {'rss before MB':>13} {'after MB':>9} "
        f"{'KB/session':>10}  shape"
    ]
    for r in rows:
        lines.append(
            f"{r['process']:<8} {r['sessions']:>8} {r['rss_before_mb']:>13} "
            f"{r['rss_after_mb']:>9} {r['kb_per_session']:>10}  {r['session_shape']}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--turns", type=int, default=2, help="ingress turns per session")
    parser.add_argument("--steps", type=int, default=2, help="worker steps per session")
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per worker step")
    parser.add_argument("--name", default="memory")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="titoflow-bench-") as tmp:
        log_dir = Path(tmp)
        broker, bootstrap = start_tansu(log_dir)
        double, engine_url = start_double(log_dir, Settings().model_path)
        try:
            for sessions in args.sessions:
                rows.append(ingress_rss(bootstrap, engine_url, log_dir, sessions, args.turns))
                print(rows[-1], flush=True)
                rows.append(worker_rss(bootstrap, log_dir, sessions, args.steps, args.tokens))
                print(rows[-1], flush=True)
        finally:
            double.stop()
            broker.stop()
    write_results(args.name, command_line(), {"rows": rows}, table(rows))


if __name__ == "__main__":
    main()

"""Steps/s from publish to consumed segments with 1 and 2 workers, finalize→segment latency, and
broker bytes per token, on a real tansu broker and real worker processes.

    .venv/bin/python -m bench.pipeline [--workers 1 2] [--tokens 1000 16000] [--steps 8000 800] \
        [--against PATH [--rounds N]]

Per (step size, worker count): ``--steps`` StepRecorded events (sessions of ``--steps-per-session``
TITO-chained steps, each adding ``tokens`` tokens: 80 % prompt tail, 20 % completion, packed
as the ingress packs them) and one SessionFinalized per session are encoded first, then
published by as many concurrent per-session publishers as there are sessions in flight (like an
ingress serving them), while this process counts segments arriving on ``<prefix>.segments``.
Steps/s = steps / (last segment consumed − first publish). Worker CPU per step is the workers'
CPU time over the steps, the capacity a core gives whatever else the machine runs. With
``--against`` another checkout's workers (e.g. the previous main, ``git worktree add``) are
measured too, each configuration just before this checkout's, and the ratios printed.

Finalize→segment is measured apart, before the burst and unsaturated: sessions published one at
a time, the clock running from the broker's ack of the SessionFinalized to its segment arriving
here.
Bytes per token compares the events as published (packed arrays) with the same events as JSON
lists (``bench/encoding.py`` compares the array encodings themselves, msgpack included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
import uuid
from array import array
from pathlib import Path
from typing import Any

from bench.encoding import json_lists
from bench.harness import command_line, group_cpu_seconds, summary_ms, write_results
from cli.dev.broker import start_tansu
from cli.dev.procs import ManagedProcess
from cli.dev.stack import start_worker
from schemas.events import SessionFinalized, StepRecorded, VersionSpan, step_id_for
from titoflow.bus import Publisher, ensure_topics, make_consumer, pin_to_end
from titoflow.client.consumer import ASSIGNMENT_TIMEOUT_S
from titoflow.settings import Settings

VOCAB = 151_000


def session_events(session_id: str, steps: int, tokens: int, seed: int) -> list[StepRecorded]:
    rng = random.Random(seed)
    completion_len = tokens // 5
    events: list[StepRecorded] = []
    parent: StepRecorded | None = None
    held = 0  # tokens of the chain so far
    for index in range(steps):
        tail = [rng.randrange(VOCAB) for _ in range(tokens - completion_len)]
        completion = [rng.randrange(VOCAB) for _ in range(completion_len)]
        step_id = step_id_for(
            session_id, parent.step_id if parent else None, array("i", tail), str(index)
        )
        step = StepRecorded(
            session_id=session_id,
            event_time=1_790_000_000.0 + index,
            step_id=step_id,
            chain_id=parent.chain_id if parent else step_id,
            parent_step_id=parent.step_id if parent else None,
            prefix="tito" if parent else "rendered",
            prefix_len=held,
            prompt_tail_ids=tail,
            completion_ids=completion,
            completion_logprobs=[-rng.expovariate(1.0) for _ in completion],
            weight_versions=[VersionSpan(version="v1", start=0, end=completion_len)],
            finish_reason="tool_calls",
            api="openai.chat",
            stream=False,
            model="titoflow-policy",
            engine_url="http://engine:8000",
            engine_request_id=f"{step_id}-bench",
            new_messages=[{"role": "tool", "content": "result " * 20, "tool_call_id": "c"}],
            response_message={"role": "assistant", "content": "", "tool_calls": []},
            render_ms=0.5,
            engine_ms=100.0,
        )
        events.append(step)
        held += tokens
        parent = step
    return events


def encode_load(
    prefix: str, sessions: int, steps: int, tokens: int
) -> tuple[dict[str, list[bytes]], dict[str, float]]:
    """Each session's records (its steps, then its finalize), and bytes per token both ways."""
    load: dict[str, list[bytes]] = {}
    packed = lists = 0
    for index in range(sessions):
        session_id = f"{prefix}-{index:05d}"
        events = session_events(session_id, steps, tokens, seed=index)
        records = [e.model_dump_json().encode() for e in events]
        if index == 0:
            packed = sum(len(r) for r in records)
            lists = sum(len(json_lists(e.model_dump())) for e in events)
        final = SessionFinalized(session_id=session_id, event_time=1_790_000_100.0)
        load[session_id] = [*records, final.model_dump_json().encode()]
    per_token = {
        "step_bytes_per_token_packed": round(packed / (steps * tokens), 2),
        "step_bytes_per_token_json_lists": round(lists / (steps * tokens), 2),
    }
    return load, per_token


def worker_topics(bootstrap: str, **fields: Any) -> tuple[str, Settings]:
    """A run id and the settings of a worker group on topics of its own, made on the broker;
    sessions are never closed for idling. ``fields`` set any other setting."""
    run_id = uuid.uuid4().hex[:8]
    settings = Settings(
        bootstrap_servers=bootstrap,
        topic_prefix=f"bench-{run_id}",
        worker_group=f"bench-{run_id}",
        idle_finalize_s=3600,
        **fields,
    )
    asyncio.run(ensure_topics(settings))
    return run_id, settings


async def wait_assigned(workers: list[ManagedProcess], partitions: int, timeout_s: float) -> None:
    """Until the workers' latest assignments split every partition of the steps topic."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        latest = []
        for worker in workers:
            lines = [
                json.loads(line)
                for line in worker.log_path.read_text().splitlines()
                if "assigned partitions" in line
            ]
            latest.append(lines[-1]["message"] if lines else "")
        owned = [m[m.index("[") :] for m in latest if "[" in m]
        covered = sum(len(json.loads(o)) for o in owned)
        if len(owned) == len(workers) and covered == partitions:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError("workers did not settle their partitions")


async def run(
    settings: Settings, load: dict[str, list[bytes]], paced: bool
) -> tuple[float, dict[str, float]]:
    """Publish ``load``; return the seconds from first publish to last segment, and for each
    session the seconds from its finalize's ack to its segment."""
    publisher = Publisher(settings)
    await publisher.start()
    consumer = make_consumer(settings, settings.topic("segments"), group_id=None)
    await consumer.start()
    # Start at the end: re-reading earlier phases' segments first would delay (and so
    # inflate) the arrival times of this phase's first sessions. On tansu the end can still be
    # behind earlier phases' last segments (see pin_to_end): read them before the clock starts
    # (they held this phase's first arrivals back ~0.2 s).
    await pin_to_end(consumer, ASSIGNMENT_TIMEOUT_S)
    while await consumer.getmany(timeout_ms=300):
        pass
    acked: dict[str, float] = {}
    arrived: dict[str, float] = {}
    steps_topic = settings.topic("steps")

    async def publish_session(session_id: str, records: list[bytes]) -> None:
        for record in records:
            await publisher.publish(steps_topic, session_id, record)
        acked[session_id] = time.perf_counter()

    async def consume() -> None:
        while len(arrived) < len(load):
            batch = await consumer.getmany(timeout_ms=200)
            now = time.perf_counter()
            for records in batch.values():
                for record in records:
                    key = record.key.decode()
                    if key in load:  # the topic holds earlier phases' segments too
                        arrived.setdefault(key, now)

    try:
        started = time.perf_counter()
        consuming = asyncio.create_task(consume())
        if paced:
            for session_id, records in load.items():
                await publish_session(session_id, records)
                await asyncio.sleep(0.02)
        else:
            await asyncio.gather(*(publish_session(s, r) for s, r in load.items()))
        published = time.perf_counter() - started
        await asyncio.wait_for(consuming, timeout=600)
        elapsed = max(arrived.values()) - started
        print(f"published in {published:.2f} s, last segment at {elapsed:.2f} s", flush=True)
    finally:
        await consumer.stop()
        await publisher.stop()
    return elapsed, {s: arrived[s] - acked[s] for s in load}


def measure(
    broker: ManagedProcess,
    bootstrap: str,
    log_dir: Path,
    workers: int,
    tokens: int,
    steps: int,
    per_session: int,
    code: Path | None = None,
) -> dict[str, Any]:
    run_id, settings = worker_topics(bootstrap)
    procs = [start_worker(settings, log_dir, f"worker-{run_id}-{i}", code) for i in range(workers)]
    try:
        asyncio.run(wait_assigned(procs, settings.steps_partitions, 120))
        warm, _ = encode_load(f"warm-{run_id}", 16, 1, 100)
        asyncio.run(run(settings, warm, paced=False))
        # Latency first, unsaturated: right after the throughput burst it would also measure
        # the tail of that burst (the first paced sessions waited up to ~0.5 s behind it).
        paced, _ = encode_load(f"p-{run_id}", 100, per_session, tokens)
        _, latency = asyncio.run(run(settings, paced, paced=True))
        sessions = max(1, steps // per_session)
        load, per_token = encode_load(f"s-{run_id}", sessions, per_session, tokens)
        cpu0 = sum(group_cpu_seconds(p.pid) for p in procs)
        broker0, own0 = group_cpu_seconds(broker.pid), time.process_time()
        elapsed, _ = asyncio.run(run(settings, load, paced=False))
        cpu = sum(group_cpu_seconds(p.pid) for p in procs) - cpu0
        broker_cpu = group_cpu_seconds(broker.pid) - broker0
        own_cpu = time.process_time() - own0
    finally:
        for proc in procs:
            proc.stop()
    done = sessions * per_session
    finalize = summary_ms(list(latency.values()))
    return {
        "code": "against" if code else "this",
        "tokens_per_step": tokens,
        "workers": workers,
        "steps": done,
        "steps_per_s": round(done / elapsed, 1),
        "tokens_per_s": round(done * tokens / elapsed),
        "worker_cpu_ms_per_step": round(cpu / done * 1000, 3),
        # What else ran on the machine for these steps: the broker, and this process (the
        # publishers and the segments reader).
        "broker_cpu_ms_per_step": round(broker_cpu / done * 1000, 3),
        "load_cpu_ms_per_step": round(own_cpu / done * 1000, 3),
        "finalize_to_segment_p50_ms": finalize["p50_ms"],
        "finalize_to_segment_p99_ms": finalize["p99_ms"],
        **per_token,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'code':>7} {'tok/step':>8} {'workers':>7} {'steps':>6} {'steps/s':>8} {'tokens/s':>10} "
        f"{'wcpu ms/step':>12} {'broker cpu':>10} {'load cpu':>8} {'fin→seg p50':>11} "
        f"{'p99 ms':>7} {'B/tok packed':>12} "
        f"{'B/tok lists':>11}"
    ]
    for r in rows:
        lines.append(
            f"{r['code']:>7} {r['tokens_per_step']:>8} {r['workers']:>7} {r['steps']:>6} "
            f"{r['steps_per_s']:>8} "
            f"{r['tokens_per_s']:>10} {r['worker_cpu_ms_per_step']:>12} "
            f"{r['broker_cpu_ms_per_step']:>10} {r['load_cpu_ms_per_step']:>8} "
            f"{r['finalize_to_segment_p50_ms']:>11} {r['finalize_to_segment_p99_ms']:>7} "
            f"{r['step_bytes_per_token_packed']:>12} {r['step_bytes_per_token_json_lists']:>11}"
        )
    return "\n".join(lines)


def ratios(rows: list[dict[str, Any]]) -> str:
    """This checkout's steps/s and worker CPU per step over the other's, per configuration: the
    median over rounds of each round's ratio (the two runs of a round are adjacent, so a drift
    in the machine's load cancels out)."""
    out = ["tok/step workers  steps/s this/against  wcpu/step this/against"]
    for tokens, workers in dict.fromkeys((r["tokens_per_step"], r["workers"]) for r in rows):
        mine = [r for r in rows if (r["tokens_per_step"], r["workers"]) == (tokens, workers)]
        pairs = list(zip(mine[0::2], mine[1::2], strict=True))  # (against, this) per round
        speed = statistics.median(b["steps_per_s"] / a["steps_per_s"] for a, b in pairs)
        cpu = statistics.median(
            b["worker_cpu_ms_per_step"] / a["worker_cpu_ms_per_step"] for a, b in pairs
        )
        out.append(f"{tokens:>8} {workers:>7}  {speed:>20.3f}  {cpu:>22.3f}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 16000])
    parser.add_argument(
        "--steps", type=int, nargs="+", default=[8000, 800], help="steps per --tokens entry"
    )
    parser.add_argument("--steps-per-session", type=int, default=8)
    parser.add_argument("--name", default="pipeline")
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="another checkout (e.g. the previous main): its workers are measured alike, each "
        "configuration right before this checkout's, and the ratio printed",
    )
    parser.add_argument("--rounds", type=int, default=1, help="measurements per configuration")
    args = parser.parse_args()
    rows = []
    codes: list[Path | None] = [args.against, None] if args.against else [None]
    with tempfile.TemporaryDirectory(prefix="titoflow-bench-") as tmp:
        broker, bootstrap = start_tansu(Path(tmp))
        try:
            for tokens, steps in zip(args.tokens, args.steps, strict=True):
                for workers in args.workers:
                    for _ in range(args.rounds):
                        for code in codes:
                            rows.append(
                                measure(
                                    broker,
                                    bootstrap,
                                    Path(tmp),
                                    workers,
                                    tokens,
                                    steps,
                                    args.steps_per_session,
                                    code,
                                )
                            )
                            print(rows[-1], flush=True)
        finally:
            broker.stop()
    text = table(rows)
    if args.against:
        text += "\n\n" + ratios(rows)
        print(ratios(rows))
    write_results(args.name, command_line(), {"rows": rows}, text)


if __name__ == "__main__":
    main()

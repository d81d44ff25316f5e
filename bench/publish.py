"""CPU per record of ``publish_many`` (acked, as a worker publishes a batch's segments) through
aiokafka (``titoflow.bus.Publisher``) and through FastStream (``titoflow.bus.StreamPublisher``
on a service broker), same run, on a real tansu.

    .venv/bin/python -m bench.publish [--bytes 2000 50000] [--records 70] [--calls 100] [--rounds 6]

Each call publishes ``--records`` records of ``--bytes`` bytes under as many keys (segments of
as many sessions) to ``<prefix>.segments`` and waits for every ack; a round times ``--calls``
calls per publisher, the two publishers' order alternating from round to round. CPU is this
process's (the publishing side only; the broker runs apart), per record, the median of rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import command_line, write_results
from cli.dev.broker import start_tansu
from titoflow.bus import Publisher, RecordPublisher, StreamPublisher, ensure_topics, service_broker
from titoflow.settings import Settings


async def measure(
    bootstrap: str, size: int, records: int, calls: int, rounds: int
) -> list[dict[str, Any]]:
    settings = Settings(bootstrap_servers=bootstrap, topic_prefix=f"pub-{uuid.uuid4().hex[:8]}")
    await ensure_topics(settings)
    topic, rng, value = settings.topic("segments"), random.Random(0), os.urandom(size)
    load = [
        [(topic, f"session-{rng.randrange(10**9)}", value) for _ in range(records)]
        for _ in range(calls)
    ]
    aiokafka = Publisher(settings)
    await aiokafka.start()
    broker = service_broker(settings, logging.getLogger("bench.publish"))
    await broker.start()
    publishers: dict[str, RecordPublisher] = {
        "aiokafka": aiokafka,
        "faststream": StreamPublisher(broker, settings),
    }
    cpu: dict[str, list[float]] = {name: [] for name in publishers}
    try:
        for publisher in publishers.values():  # connections and metadata, off the clock
            for batch in load[:5]:
                await publisher.publish_many(batch)
        for round_ in range(rounds):
            names = list(publishers) if round_ % 2 == 0 else list(publishers)[::-1]
            for name in names:
                started = time.process_time()
                for batch in load:
                    await publishers[name].publish_many(batch)
                cpu[name].append((time.process_time() - started) / (calls * records) * 1e6)
    finally:
        await aiokafka.stop()
        await broker.stop()
    return [
        {
            "publisher": name,
            "record_bytes": size,
            "records_per_call": records,
            "cpu_us_per_record": round(statistics.median(rounds_cpu), 2),
            "rounds_cpu_us_per_record": [round(c, 2) for c in rounds_cpu],
            "ratio_to_aiokafka": round(
                statistics.median(rounds_cpu) / statistics.median(cpu["aiokafka"]), 3
            ),
        }
        for name, rounds_cpu in cpu.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, nargs="+", default=[2000, 50000])
    parser.add_argument("--records", type=int, default=70, help="records per publish_many call")
    parser.add_argument("--calls", type=int, default=100, help="calls per round and publisher")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--name", default="publish")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="titoflow-bench-") as tmp:
        broker, bootstrap = start_tansu(Path(tmp))
        try:
            for size in args.bytes:
                rows += asyncio.run(measure(bootstrap, size, args.records, args.calls, args.rounds))
        finally:
            broker.stop()
    lines = [f"{'publisher':>10} {'bytes':>7} {'CPU µs/record':>13} {'/aiokafka':>9}  rounds"]
    for r in rows:
        lines.append(
            f"{r['publisher']:>10} {r['record_bytes']:>7} {r['cpu_us_per_record']:>13} "
            f"{r['ratio_to_aiokafka']:>9}  {r['rounds_cpu_us_per_record']}"
        )
    write_results(args.name, command_line(), {"rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()

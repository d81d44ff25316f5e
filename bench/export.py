"""``titoflow export`` throughput: segments/s and MB/s from a JSONL file and from a segments topic
on a real tansu broker to Parquet, Parquet to a Hugging Face ``datasets`` directory, and reading
an export back, all in one run on the same segments.

    .venv/bin/python -m bench.export [--segments 2000] [--tokens 4000] [--rounds 3]

The segments are made first (``--tokens`` tokens each: a 20 % completion with random float32
logprobs, the rest context), written as ``titoflow replay --out`` writes them and published to
a fresh segments topic. Each path then runs the export's own code (``workers.export``: parse,
drop repeats, Parquet row groups), ``--rounds`` times; the median round is reported. MB/s is
megabytes (10^6) of segment event JSON (what the topic carries) per second; the output size is
the Parquet file's (zstd) or the datasets directory's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import command_line, write_results
from cli.dev.broker import start_tansu
from schemas.events import SegmentFinalized, SegmentStep
from titoflow.bus import Publisher, ensure_topics
from titoflow.client.export import ParquetWriter, parquet_to_datasets, read_segments, require
from titoflow.settings import Settings
from workers.export.run import export
from workers.export.sources import from_jsonl, from_topic
from workers.replay.progress import NoProgress
from workers.replay.sinks import segment_bytes

VOCAB = 151_000
PUBLISH_CONCURRENCY = 32


def make_segments(count: int, tokens: int, seed: int = 0) -> list[SegmentFinalized]:
    rng = np.random.default_rng(seed)
    completion = max(tokens // 5, 1)
    context = tokens - completion
    segments = []
    for index in range(count):
        logprobs = np.zeros(tokens, dtype=np.float32)
        logprobs[context:] = -rng.exponential(1.0, completion).astype(np.float32)
        segments.append(
            SegmentFinalized(
                session_id=f"bench-{index}",
                event_time=1_790_000_000.0 + index,
                segment_id=f"seg-{index}",
                chain_id=f"chain-{index}",
                instance_id=f"prompt-{index // 8}",
                rollout_id=f"bench-{index}",
                token_ids=rng.integers(0, VOCAB, tokens, dtype=np.int32).tolist(),
                loss_mask=[0] * context + [1] * completion,
                logprobs=logprobs.tolist(),
                logprob_source=[0] * context + [1] * completion,
                steps=[
                    SegmentStep(
                        step_id=f"step-{index}",
                        prompt_start=0,
                        completion_start=context,
                        completion_end=tokens,
                        prefix="rendered",
                        finish_reason="stop",
                    )
                ],
                finalize_reason="finalized",
                reward=float(index % 2),
                metadata={"data_source": "bench"},
                last_of_session=True,
            )
        )
    return segments


async def publish(settings: Settings, encoded: list[bytes], keys: list[str]) -> None:
    publisher = Publisher(settings)
    queue = list(zip(keys, encoded, strict=True))

    async def sender() -> None:
        while queue:
            key, value = queue.pop()
            await publisher.publish(settings.topic("segments"), key, value)

    try:
        await asyncio.gather(*(sender() for _ in range(PUBLISH_CONCURRENCY)))
    finally:
        await publisher.stop()


def timed(run: Callable[[], Any], rounds: int) -> float:
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--segments", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="export")
    args = parser.parse_args()
    require(datasets=True)  # imported before any clock runs
    segments = make_segments(args.segments, args.tokens)
    encoded = [segment_bytes(segment) for segment in segments]
    event_mb = sum(len(value) for value in encoded) / 1e6
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="titoflow-bench-") as tmp:
        work = Path(tmp)
        jsonl = work / "segments.jsonl"
        jsonl.write_bytes(b"".join(value + b"\n" for value in encoded))
        parquet = work / "segments.parquet"
        directory = work / "segments-ds"
        broker, bootstrap = start_tansu(work)
        try:
            settings = Settings(
                bootstrap_servers=bootstrap, topic_prefix=f"bench-{uuid.uuid4().hex[:8]}"
            )

            async def prepare() -> None:
                await ensure_topics(settings)
                keys = [segment.instance_id or segment.session_id for segment in segments]
                await publish(settings, encoded, keys)

            asyncio.run(prepare())

            def exported(reads: Callable[[], Any]) -> Callable[[], None]:
                def run() -> None:
                    with ParquetWriter(parquet) as writer:
                        report = asyncio.run(export(reads(), writer))
                    assert report.segments == len(segments), report

                return run

            paths: list[tuple[str, Callable[[], Any], Path]] = [
                ("jsonl -> parquet", exported(lambda: from_jsonl(jsonl, NoProgress())), parquet),
                (
                    "topic -> parquet",
                    exported(
                        lambda: from_topic(settings, settings.topic("segments"), NoProgress())
                    ),
                    parquet,
                ),
                ("parquet -> datasets", lambda: parquet_to_datasets(parquet, directory), directory),
                ("read_segments(parquet)", lambda: sum(1 for _ in read_segments(parquet)), parquet),
                (
                    "read_segments(datasets)",
                    lambda: sum(1 for _ in read_segments(directory)),
                    directory,
                ),
            ]
            for name, run, output in paths:
                seconds = timed(run, args.rounds)
                rows.append(
                    {
                        "path": name,
                        "segments": len(segments),
                        "tokens_per_segment": args.tokens,
                        "seconds": round(seconds, 3),
                        "segments_per_s": round(len(segments) / seconds, 1),
                        "event_mb_per_s": round(event_mb / seconds, 1),
                        "output_mb": round(size_of(output) / 1e6, 1),
                    }
                )
                print(rows[-1], flush=True)
        finally:
            broker.stop()
    head = f"{args.segments} segments x {args.tokens} tokens, {event_mb:.1f} MB of event JSON"
    lines = [
        head,
        f"{'path':<24} {'s':>7} {'segments/s':>11} {'MB/s':>7} {'output MB':>10}",
        *[
            f"{r['path']:<24} {r['seconds']:>7} {r['segments_per_s']:>11} "
            f"{r['event_mb_per_s']:>7} {r['output_mb']:>10}"
            for r in rows
        ],
    ]
    write_results(args.name, command_line(), {"rows": rows, "event_mb": event_mb}, "\n".join(lines))


if __name__ == "__main__":
    main()

"""A trainer process for tests/titoflow/client/test_consumer_restart.py, killed and restarted by it:
the training loop of docs/trainer.md "Delivery and restarts", run as written.

Its "model" is the list of segment ids of the last batch; a checkpoint is one JSON line per batch
(the batch's ids and ``SegmentConsumer.offsets()``), written and fsynced at once. Invariant: a
complete line is a batch trained on; a torn last line (a kill mid-write) is cut off on start, so
the checkpoint holds both or neither, as the loop asks of ``save_checkpoint``. The tests read what
its group committed with :func:`committed_offsets`.

    python -m tests.support.consumer_trainer BOOTSTRAP PREFIX CHECKPOINT LIFE BATCH_SIZE HORIZON_S
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

from schemas.events import SegmentFinalized
from tests.support.doc_blocks import blocks_run_by
from titoflow.bus import TopicPartition, make_consumer
from titoflow.client import consumer
from titoflow.settings import Settings

GROUP = "trainer"  # the example's


def doc_example() -> str:
    [example] = blocks_run_by("tests/titoflow/client/test_consumer_restart.py")
    return example


def load_checkpoint_lines(path: Path) -> list[dict[str, Any]]:
    """The complete lines of the checkpoint; a torn last line is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        with path.open("r+b") as out:
            out.truncate(len(complete))
    return [json.loads(line) for line in complete.splitlines()]


async def committed_offsets(settings: Settings, partitions: list[int]) -> dict[int, int | None]:
    """The offsets the trainer's group (``GROUP``) committed on ``partitions`` of the segments
    topic (``None`` where it committed none)."""
    group = make_consumer(settings, group_id=GROUP)
    await group.start()
    try:
        topic = settings.topic("segments")
        return {p: await group.committed(TopicPartition(topic, p)) for p in partitions}
    finally:
        await group.stop()


def run(
    bootstrap: str, prefix: str, path: Path, life: int, batch_size: int, horizon_s: float
) -> None:
    def load_checkpoint() -> tuple[list[str], dict[int, int]]:
        lines = load_checkpoint_lines(path)
        if not lines:
            return [], {}
        return lines[-1]["ids"], {int(p): o for p, o in lines[-1]["offsets"].items()}

    def train_step(model: list[str], batch: list[SegmentFinalized]) -> list[str]:
        return [segment.segment_id for segment in batch]

    def save_checkpoint(model: list[str], offsets: dict[int, int]) -> None:
        line = json.dumps({"life": life, "ids": model, "offsets": offsets}).encode() + b"\n"
        with path.open("ab") as out:
            out.write(line)
            out.flush()
            os.fsync(out.fileno())

    # The example imports SegmentConsumer from its module: give it the test's horizon (its
    # producer's bound on repeats) instead of the default hour, so the read-back starts mid-log.
    consumer.SegmentConsumer = functools.partial(  # type: ignore[misc, assignment]
        consumer.SegmentConsumer, dedupe_horizon_s=horizon_s
    )
    namespace: dict[str, Any] = {
        "load_checkpoint": load_checkpoint,
        "train_step": train_step,
        "save_checkpoint": save_checkpoint,
    }
    exec(compile(doc_example(), "docs/trainer.md", "exec"), namespace)
    settings = Settings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    asyncio.run(namespace["train"](settings, batch_size=batch_size))


if __name__ == "__main__":
    bootstrap, prefix, path, life, batch_size, horizon = sys.argv[1:7]
    run(bootstrap, prefix, Path(path), int(life), int(batch_size), float(horizon))

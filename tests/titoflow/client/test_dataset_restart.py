"""The torch dataset over the topic across restarts (titoflow/client/progress.py,
titoflow/client/torch_data.py): the committed offset never passes a record held in an open group
or a partly filled row, and a dataset resumed from its checkpoint hands out every segment in one
item once, the held ones included, although groups complete out of order.

On the real broker (tests/support/kafka_fixtures.py), docs/trainer.md's restart loop is run as
written:
stopped with a group open and an item handed out but not trained on, then restarted from its
checkpoint in the same group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from schemas.events import SegmentFinalized, SessionDiscarded
from tests.support.consumer_trainer import committed_offsets
from tests.support.doc_blocks import blocks_run_by
from tests.support.factories import token_segment
from titoflow.bus import Publisher, home_partition
from titoflow.client.progress import Position, Progress
from titoflow.client.topic_source import TopicSource
from titoflow.client.torch_data import SegmentDataset
from titoflow.settings import Settings

PARTITIONS = 2


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 12), min_size=PARTITIONS, max_size=PARTITIONS),
    st.sets(st.tuples(st.integers(0, PARTITIONS - 1), st.integers(0, 11)), max_size=4),
    st.lists(
        st.tuples(
            st.sampled_from(["read", "read", "read", "release", "checkpoint", "crash"]),
            st.integers(0, PARTITIONS - 1),
            st.lists(st.integers(0, 100), min_size=1, max_size=3),
        ),
        max_size=60,
    ),
)
# A group completing before an older one of its partition, checkpointed, then a restart.
@example(
    [2, 0],
    set(),
    [("read", 0, [0]), ("read", 0, [0]), ("release", 0, [1]), ("checkpoint", 0, [0])],
)
def test_the_watermark_never_passes_a_held_record_and_resuming_hands_each_out_once(
    lengths: list[int],
    repeats: set[Position],
    ops: list[tuple[str, int, list[int]]],
) -> None:
    """Lives of a reader: it reads partitions in order (repeats, which the consumer drops, never
    reach it), releases held records in any order (groups completing out of order), checkpoints,
    crashes and resumes from its last checkpoint (JSON round-tripped). What counts is what was
    released up to a checkpoint (the model kept); a last life reads and releases the rest."""
    kept: list[Position] = []
    state: dict[str, Any] | None = None

    def new_life() -> tuple[Progress, dict[int, int], list[Position], list[Position]]:
        progress = Progress(state)
        start = {int(p): o for p, o in (state or {}).get("offsets", {}).items()}
        return progress, {p: start.get(p, 0) for p in range(PARTITIONS)}, [], []

    def read(partition: int) -> None:
        offset = cursor[partition]
        cursor[partition] += 1
        if (partition, offset) not in repeats and progress.read(partition, offset):
            held.append((partition, offset))

    progress, cursor, held, released = new_life()
    for op, partition, picks in ops:
        if op == "read" and cursor[partition] < lengths[partition]:
            read(partition)
        elif op == "release" and held:
            chosen = sorted({held[i % len(held)] for i in picks})
            progress.release(chosen)
            held = [h for h in held if h not in chosen]
            released += chosen
        elif op == "checkpoint":
            state = json.loads(json.dumps(progress.checkpoint()))
            kept += released
            released = []
        elif op == "crash":
            progress, cursor, held, released = new_life()
        mark = progress.watermark()
        for p, offset in held:
            assert mark[p] <= offset, "the watermark passed a held record"
        assert all(mark[p] <= cursor[p] for p in mark)
    progress, cursor, held, released = new_life()
    for partition in range(PARTITIONS):
        while cursor[partition] < lengths[partition]:
            read(partition)
    progress.release(held)
    kept += held
    everything = {
        (p, o) for p in range(PARTITIONS) for o in range(lengths[p]) if (p, o) not in repeats
    }
    assert Counter(kept) == Counter(everything), "not handed out exactly once"
    assert progress.checkpoint()["done"] == {}, "nothing is left above the watermark"


def doc_example() -> str:
    [example] = blocks_run_by("tests/titoflow/client/test_dataset_restart.py")
    return example


class Stop(Exception):
    """Stops a life of the trainer, as a crash would, between two items."""


class Trainer:
    """docs/trainer.md's loop on a thread; its "model" is the segment ids of its last group and
    its checkpoint the list of (model, data) it saved. ``stop_at_call``, or ``stop_now`` set:
    raise in ``train_step`` (that group handed out, not trained on, not saved)."""

    def __init__(self) -> None:
        self.saved: list[tuple[list[str], dict[str, Any]]] = []

    def run(self, settings: Settings, stop_at_call: int | None = None) -> threading.Thread:
        calls = 0
        self.stop_now = threading.Event()

        def load_checkpoint() -> tuple[list[str], dict[str, Any] | None]:
            return self.saved[-1] if self.saved else ([], None)

        def train_step(model: list[str], group: dict[str, Any]) -> list[str]:
            nonlocal calls
            calls += 1
            if calls == stop_at_call or self.stop_now.is_set():
                raise Stop
            return list(group["segment_ids"])

        def save_checkpoint(model: list[str], data: dict[str, Any]) -> None:
            self.saved.append((model, json.loads(json.dumps(data))))

        namespace: dict[str, Any] = {
            "load_checkpoint": load_checkpoint,
            "train_step": train_step,
            "save_checkpoint": save_checkpoint,
        }
        exec(compile(doc_example(), "docs/trainer.md", "exec"), namespace)

        def life() -> None:
            with contextlib.suppress(Stop):
                namespace["train"](settings)

        thread = threading.Thread(target=life, name="trainer-life")
        thread.start()
        return thread

    def trained(self) -> Counter[str]:
        return Counter(sid for model, _ in self.saved for sid in model)


def on_partition(settings: Settings, partition: int, prefix: str) -> str:
    """An instance id the topic's key puts on ``partition``."""
    partitions = list(range(settings.segments_partitions))
    return next(
        name
        for name in (f"{prefix}{i}" for i in range(1000))
        if home_partition(name, partitions) == partition
    )


async def wait_for(done: Any, thread: threading.Thread, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not done():
            assert thread.is_alive(), "the trainer stopped early"
            await asyncio.sleep(0.1)


async def test_a_stopped_trainer_resumes_from_its_checkpoint_and_trains_on_each_segment_once(
    settings: Settings,
) -> None:
    """Partition P holds a0 (its group open until a1 comes), then groups b and d (d: one
    segment and a discarded session); partition Q group c. The first life trains on two of the
    complete groups and stops on the third; its commit on P stays at a0 although b or d were
    handed out above it. The second life, resumed from the checkpoint, hands out a (completed
    now) and the third group, never the first two again (nor b1, published again)."""
    p, q = 0, 1
    a, b, d, z = (on_partition(settings, p, x) for x in "abdz")
    c = on_partition(settings, q, "c")
    body = [(1, False, 0.0, 0), (2, True, -1.0, 1)]
    meta = {"group_size": 2}

    def seg(name: str, instance: str) -> SegmentFinalized:
        return token_segment(name, body, instance=instance, metadata=meta, reward=1.0)

    publisher = Publisher(settings)
    await publisher.start()

    async def publish(*events: SegmentFinalized | SessionDiscarded) -> None:
        for event in events:
            key = event.instance_id or ""
            await publisher.publish(
                settings.topic("segments"), key, event.model_dump_json().encode()
            )

    b1 = seg("b1", b)
    gone = SessionDiscarded(session_id="sess-d1", event_time=0, instance_id=d, metadata=meta)
    trainer = Trainer()
    try:
        await publish(seg("a0", a), seg("b0", b), b1, seg("d0", d), gone, seg("c0", c))
        await publish(seg("c1", c))
        first = trainer.run(settings, stop_at_call=3)
        await asyncio.to_thread(first.join, 90)
        assert not first.is_alive()
        assert len(trainer.saved) == 2 and trainer.trained().total() in (3, 4)
        data = trainer.saved[-1][1]
        assert data["offsets"][str(p)] == 0, "the commit passed a0, held in an open group"
        assert await committed_offsets(settings, [p, q]) == {
            int(k): v for k, v in data["offsets"].items()
        } | ({} if str(q) in data["offsets"] else {q: None})

        await publish(seg("a1", a), b1)
        second = trainer.run(settings)
        everything = {"seg-a0", "seg-a1", "seg-b0", "seg-b1", "seg-c0", "seg-c1", "seg-d0"}
        await wait_for(lambda: set(trainer.trained()) == everything, second)
        trainer.stop_now.set()
        await publish(token_segment("z0", body, instance=z, metadata={"group_size": 1}))
        await asyncio.to_thread(second.join, 60)
        assert not second.is_alive()
    finally:
        await publisher.stop()
    assert trainer.trained() == Counter(everything), "trained on more or less than once"
    final = {int(k): v for k, v in trainer.saved[-1][1]["offsets"].items()}
    assert await committed_offsets(settings, sorted(final)) == final


def test_a_group_topic_source_refuses_data_loader_workers() -> None:
    """Refused in the worker, before its consumer would join the group: no broker needed."""
    settings = Settings(bootstrap_servers="127.0.0.1:9")
    dataset = SegmentDataset(TopicSource(settings, group_id="trainer"), pad_id=0)
    with pytest.raises(ValueError, match="num_workers=0"):
        next(iter(DataLoader(dataset, batch_size=None, num_workers=1)))
    with pytest.raises(RuntimeError, match="being iterated"):
        dataset.commit()
    with pytest.raises(RuntimeError, match="group_id"):
        SegmentDataset([], pad_id=0).commit()


async def test_a_partly_filled_packed_row_is_held_back_from_the_commit(settings: Settings) -> None:
    """s0, a discard notice and s1 fill a row; s2 does not fit, so the row is handed out and s2
    held: the commit and the checkpoint stop at s2, and a resumed dataset hands out s2 alone."""
    body = [(1, False, 0.0, 0), (2, True, -1.0, 1)]
    s0, s1, s2 = (token_segment(f"s{i}", body, instance="one") for i in range(3))
    notice = SessionDiscarded(session_id="gone", event_time=0, instance_id="one")
    publisher = Publisher(settings)
    await publisher.start()
    try:
        for event in [s0, notice, s1, s2]:
            value = event.model_dump_json().encode()
            await publisher.publish(settings.topic("segments"), "one", value)
    finally:
        await publisher.stop()
    partition = home_partition("one", list(range(settings.segments_partitions)))

    def first_item(dataset: SegmentDataset) -> tuple[list[str], dict[str, Any]]:
        items = iter(dataset)
        item = next(items)
        data = dataset.checkpoint()
        dataset.commit()
        del items  # the data loader's way to stop: the generator closes its consumer
        return item["segment_ids"], data

    def dataset(resume: dict[str, Any] | None) -> SegmentDataset:
        source = TopicSource(settings, group_id="trainer", resume=resume, poll_s=0.1)
        return SegmentDataset(source, pad_id=0, pack_tokens=4, timeout_s=1.0)

    packer = dataset(None)
    ids, data = await asyncio.to_thread(first_item, packer)
    assert ids == ["seg-s0", "seg-s1"]
    assert data == {"offsets": {str(partition): 3}, "done": {}}
    assert await committed_offsets(settings, [partition]) == {partition: 3}
    # A second pass of the same dataset, and a new one resumed from the checkpoint: s2 alone.
    for resumed in [packer, dataset(data)]:
        ids, after = await asyncio.to_thread(first_item, resumed)
        assert ids == ["seg-s2"] and after == {"offsets": {str(partition): 4}, "done": {}}
    assert not [t for t in threading.enumerate() if t.name == "titoflow-segments"]

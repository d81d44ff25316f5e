"""The torch dataset (titoflow/client/torch_data.py) and what it is built on: packing
(titoflow/client/packing.py) never splits a sequence, keeps its boundaries exact and its tokens,
masks and logprob bits identical to the segment's, and respects the budget; grouping
(titoflow/client/groups.py) hands out each instance's group once, when its driver's group size
of sessions ended, or incomplete after the timeout or at the end of the source."""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

from schemas.events import SegmentFinalized, SessionDiscarded, VersionSpan
from tests.support.factories import token_segment
from tests.support.packed_items import PAD, check_item_holds
from titoflow.bus import Publisher
from titoflow.client.batch import version_number
from titoflow.client.groups import GroupCollector
from titoflow.client.packing import pack_greedy
from titoflow.client.segment_files import read_jsonl
from titoflow.client.topic_source import TopicSource
from titoflow.client.torch_data import SegmentDataset, block_causal_mask
from titoflow.settings import Settings

# One sequence: (token ids, loss mask, logprobs, logprob source); its first token is context.
token = st.tuples(
    st.integers(0, 151935),
    st.booleans(),
    st.floats(width=32, max_value=0.0, allow_nan=False),
    st.sampled_from([1, 2, 3]),
)
sequence = st.lists(token, min_size=1, max_size=24).map(
    lambda ts: [(ts[0][0], False, 0.0, 0), *ts[1:]]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(sequence, min_size=1, max_size=12), st.integers(24, 80))
def test_packing_keeps_every_sequence_whole_exact_and_within_the_budget(
    sequences: list[list[tuple[int, bool, float, int]]], budget: int
) -> None:
    segments = [token_segment(f"s{i}", tokens) for i, tokens in enumerate(sequences)]
    items = list(SegmentDataset(segments, pad_id=PAD, pack_tokens=budget))
    assert [sid for item in items for sid in item["segment_ids"]] == [
        s.segment_id for s in segments
    ]
    lengths = {s.segment_id: len(s.token_ids) for s in segments}
    for index, item in enumerate(items):
        held = [s for s in segments if s.segment_id in item["segment_ids"]]
        check_item_holds(item, held)
        assert item["input_ids"].shape == (1, sum(lengths[sid] for sid in item["segment_ids"]))
        assert item["input_ids"].shape[1] <= budget
        if index + 1 < len(items):  # closed only because the next sequence did not fit
            assert item["input_ids"].shape[1] + lengths[items[index + 1]["segment_ids"][0]] > budget


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), max_size=30), st.integers(1, 40))
def test_pack_greedy_partitions_in_order_within_the_budget(lengths: list[int], budget: int) -> None:
    if any(n > budget for n in lengths):
        with pytest.raises(ValueError, match="exceeds the packing budget"):
            pack_greedy(lengths, budget)
        return
    rows = pack_greedy(lengths, budget)
    assert [i for row in rows for i in row] == list(range(len(lengths)))
    assert all(row and sum(lengths[i] for i in row) <= budget for row in rows)
    for row, after in itertools.pairwise(rows):
        assert sum(lengths[i] for i in row) + lengths[after[0]] > budget


def test_one_segment_per_item_with_weight_versions_and_reward() -> None:
    tokens = [(7, False, 0.0, 0), (8, True, -0.5, 1), (9, True, -1.5, 1), (10, False, 0.0, 0)]
    versions = [
        VersionSpan(version="v3", start=1, end=2),
        VersionSpan(version="v4", start=2, end=3),
    ]
    segment = token_segment("a", tokens, reward=0.25, versions=versions)
    no_reward = token_segment("b", tokens)
    [item, other] = list(SegmentDataset([segment, no_reward], pad_id=PAD))
    check_item_holds(item, [segment])
    assert item["weight_version"].tolist() == [[-1, 3, 4, -1]]
    assert item["reward"].tolist() == [0.25] and torch.isnan(other["reward"]).all()
    assert (item["group"], item["complete"]) == (None, True)
    assert item["input_ids"].dtype == torch.int64 and item["old_logprobs"].dtype == torch.float32
    assert version_number("step-300") == 300
    assert version_number("default") == 0  # vLLM's label of the weights it started with
    with pytest.raises(ValueError, match="version_number="):
        version_number("main")


def test_refuses_a_trainable_first_token_and_a_sequence_over_the_budget() -> None:
    first = token_segment("a", [(1, True, -1.0, 1), (2, False, 0.0, 0)])
    with pytest.raises(ValueError, match="first token is in the loss"):
        list(SegmentDataset([first], pad_id=PAD))
    long = token_segment("b", [(1, False, 0.0, 0)] * 9)
    with pytest.raises(ValueError, match="exceeds the packing budget of 8"):
        list(SegmentDataset([long], pad_id=PAD, pack_tokens=8))


# A session of a group: (instance index, how it ends, its number of segments).
session_plan = st.tuples(
    st.integers(0, 2), st.sampled_from(["finalized", "discarded"]), st.integers(1, 3)
)


@settings(max_examples=60, deadline=None)
@given(st.lists(session_plan, min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_groups_are_handed_out_once_when_their_sessions_ended(
    plans: list[tuple[int, str, int]], random: Any
) -> None:
    """Each instance's sessions, interleaved in any order that keeps each session's own order
    (one partition): its group comes out right after its last session ended, holding exactly
    its sessions' segments (unused samples left out); the rest at the end, incomplete."""
    per_session: list[list[SegmentFinalized | SessionDiscarded]] = []
    sizes = {i: sum(1 for p in plans if p[0] == i) for i in range(3)}
    for s, (instance, how, count) in enumerate(plans):
        meta = {"group_size": sizes[instance] + (instance == 2)}  # instance 2 never completes
        if how == "discarded":
            per_session.append(
                [
                    SessionDiscarded(
                        session_id=f"s{s}", event_time=0, instance_id=f"i{instance}", metadata=meta
                    )
                ]
            )
            continue
        per_session.append(
            [
                token_segment(
                    f"s{s}-{k}",
                    [(1, False, 0.0, 0), (2, True, -1.0, 1)],
                    instance=f"i{instance}",
                    session=f"s{s}",
                    last=k == count - 1,
                    unused=k == 0 and count == 3,
                    metadata=meta,
                )
                for k in range(count)
            ]
        )
    events: list[SegmentFinalized | SessionDiscarded] = []
    queues = [list(events_of) for events_of in per_session]
    while any(queues):
        events.append(random.choice([q for q in queues if q]).pop(0))

    collector = GroupCollector()
    out: list[tuple[int, Any]] = []
    for position, event in enumerate(events):
        group = collector.add(event, now=0.0)
        if group is not None:
            out.append((position, group))
    rest = collector.flush()
    for instance in range(3):
        sessions = [f"s{s}" for s, p in enumerate(plans) if p[0] == instance]
        expected = [
            e.segment_id
            for e in events
            if isinstance(e, SegmentFinalized) and e.session_id in sessions and not e.unused_sample
        ]
        done = [(at, g) for at, g in out if g.key == f"i{instance}"]
        if not sessions:
            assert not done and all(g.key != f"i{instance}" for g in rest)
            continue
        if instance == 2:
            assert not done
            [group] = [g for g in rest if g.key == "i2"]
            assert not group.complete
        else:
            [(at, group)] = done
            assert group.complete
            last_end = max(
                i
                for i, e in enumerate(events)
                if e.session_id in sessions
                and (isinstance(e, SessionDiscarded) or e.last_of_session)
            )
            assert at == last_end
        assert [s.segment_id for s in group.segments] == expected


def test_group_timeout_and_size_from_the_collector_or_metadata() -> None:
    def seg(name: str, instance: str, **kw: Any) -> SegmentFinalized:
        return token_segment(
            name, [(1, False, 0.0, 0), (2, True, -1.0, 1)], instance=instance, **kw
        )

    collector = GroupCollector(group_size=2, timeout_s=10.0)
    assert collector.add(seg("a", "p"), now=0.0) is None
    assert collector.add(seg("b", "q", metadata={"group_size": 1}), now=1.0) is not None
    assert collector.expired(now=9.9) == []
    [late] = collector.expired(now=10.0)
    assert (late.key, late.complete, [s.segment_id for s in late.segments]) == (
        "p",
        False,
        ["seg-a"],
    )
    # The same instance later: a new group (a prompt sampled again).
    assert collector.add(seg("c", "p"), now=11.0) is None
    with pytest.raises(ValueError, match="no group size"):
        GroupCollector().add(seg("d", "r"), now=0.0)
    with pytest.raises(ValueError, match="not a positive int"):
        GroupCollector().add(seg("e", "r", metadata={"group_size": "4"}), now=0.0)


def test_grouped_items_from_a_jsonl_file_through_a_data_loader(tmp_path: Path) -> None:
    """The replay's JSONL (repeats included) → one item per group, padded or packed, and a
    partial packed row or group handed out after the timeout on a source's idle ticks."""
    body = [(1, False, 0.0, 0), (2, True, -1.0, 1), (3, True, -2.0, 1)]
    group = [
        token_segment(f"r{i}", body, instance="p", reward=float(i), metadata={"group_size": 2})
        for i in range(2)
    ]
    path = tmp_path / "segments.jsonl"
    # A group of one discarded session: complete, and nothing to train on.
    gone = SessionDiscarded(
        session_id="gone", event_time=0, instance_id="q", metadata={"group_size": 1}
    )
    lines = [e.model_dump_json() for e in [group[0], group[0], gone, gone, group[1]]]
    path.write_text("\n".join(lines) + "\n")
    read = [getattr(e, "segment_id", e.session_id) for e in read_jsonl(path)]
    assert read == ["seg-r0", "gone", "seg-r1"]

    padded = SegmentDataset(path, pad_id=PAD, group_by_instance=True, pad_to_multiple_of=4)
    [item] = list(DataLoader(padded, batch_size=None))
    check_item_holds(item, group)
    assert item["input_ids"].shape == (2, 4) and item["reward"].tolist() == [0.0, 1.0]
    assert (item["group"], item["complete"]) == ("p", True)
    packed = SegmentDataset(path, pad_id=PAD, group_by_instance=True, pack_tokens=6)
    [item] = list(packed)
    check_item_holds(item, group)
    assert item["input_ids"].shape == (1, 6)

    clock = iter(range(100))
    ticks = [group[0], None, None, None]
    partial = SegmentDataset(
        ticks, pad_id=PAD, pack_tokens=64, timeout_s=2, clock=lambda: next(clock)
    )
    assert [item["segment_ids"] for item in partial] == [["seg-r0"]]
    clock = iter(range(100))
    late = SegmentDataset(
        ticks, pad_id=PAD, group_by_instance=True, timeout_s=2, clock=lambda: next(clock)
    )
    assert [(i["segment_ids"], i["complete"]) for i in late] == [(["seg-r0"], False)]
    with pytest.raises(ValueError, match=r"segments\.jsonl:1: not a segments-topic event"):
        path.write_text('{"type": "step_recorded"}\n')
        list(read_jsonl(path))


def test_a_packed_row_with_block_causal_mask_gives_each_segment_its_own_logits(
    model_dir: Path,
) -> None:
    """The tiny Qwen3 (transformers, sdpa) on a packed row attends within each segment: the
    same logits as each segment alone. Position ids alone do not keep the boundary there."""
    policy: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy.eval()
    first = token_segment("a", [(5, False, 0.0, 0), (6, True, -1.0, 1), (7, True, -1.0, 1)])
    second = token_segment("b", [(11, False, 0.0, 0), (12, False, 0.0, 0), (13, True, -2.0, 1)])
    [item] = list(SegmentDataset([first, second], pad_id=PAD, pack_tokens=8))
    assert item["input_ids"].shape == (1, 6)
    padded = {
        k: torch.nn.functional.pad(item[k], (0, 2), value=v)
        for k, v in [("input_ids", PAD), ("position_ids", 0), ("sequence_ids", -1)]
    }
    mask = block_causal_mask(padded["sequence_ids"])
    assert mask.shape == (1, 1, 8, 8)
    with torch.no_grad():
        packed = policy(
            input_ids=padded["input_ids"], position_ids=padded["position_ids"], attention_mask=mask
        ).logits[0]
        unmasked = policy(input_ids=item["input_ids"], position_ids=item["position_ids"]).logits[0]
        alone = [policy(input_ids=torch.tensor([s.token_ids])).logits[0] for s in (first, second)]
    assert torch.allclose(packed[:3], alone[0], atol=1e-4)
    assert torch.allclose(packed[3:6], alone[1], atol=1e-4)
    assert not torch.allclose(unmasked[3:6], alone[1], atol=1e-4)


async def test_the_topic_source_feeds_groups_on_tansu_and_stops_its_consumer(
    settings: Settings,
) -> None:
    """Segments published to the topic (a repeat, an unused sample, a group that never
    completes) come out grouped, each once; the incomplete group after the timeout, on the
    source's idle ticks; closing the dataset's iterator stops the consumer's thread."""
    body = [(1, False, 0.0, 0), (2, True, -1.0, 1)]
    meta = {"group_size": 2}
    p0 = token_segment("p0", body, instance="p", metadata=meta, reward=1.0)
    unused = token_segment("p1u", body, instance="p", session="sess-p1", last=False, unused=True)
    p1 = token_segment("p1", body, instance="p", metadata=meta, reward=0.0)
    q0 = token_segment("q0", body, instance="q", metadata={"group_size": 3})
    publisher = Publisher(settings)
    await publisher.start()
    try:
        for event in [q0, p0, p0, unused, p1]:
            await publisher.publish(
                settings.topic("segments"),
                event.instance_id or "",
                event.model_dump_json().encode(),
            )
    finally:
        await publisher.stop()

    def first_two() -> list[dict[str, Any]]:
        source = TopicSource(settings, group_id=None, poll_s=0.1)
        dataset = SegmentDataset(source, pad_id=PAD, group_by_instance=True, timeout_s=1.0)
        return list(itertools.islice(dataset, 2))

    items = await asyncio.to_thread(first_two)
    assert [(i["group"], i["segment_ids"], i["complete"]) for i in items] == [
        ("p", ["seg-p0", "seg-p1"], True),
        ("q", ["seg-q0"], False),
    ]
    check_item_holds(items[0], [p0, p1])
    assert items[0]["reward"].tolist() == [1.0, 0.0]
    assert not [t for t in threading.enumerate() if t.name == "titoflow-segments"]


def test_data_loader_workers_each_take_whole_instances() -> None:
    body = [(1, False, 0.0, 0), (2, True, -1.0, 1)]
    segments = [
        token_segment(f"{instance}{k}", body, instance=instance, metadata={"group_size": 2})
        for k in range(2)
        for instance in "abcdef"
    ]
    dataset = SegmentDataset(segments, pad_id=PAD, group_by_instance=True)
    items = list(DataLoader(dataset, batch_size=None, num_workers=2))
    assert sorted((i["group"], i["segment_ids"], i["complete"]) for i in items) == [
        (x, [f"seg-{x}0", f"seg-{x}1"], True) for x in "abcdef"
    ]

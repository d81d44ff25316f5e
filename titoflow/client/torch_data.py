"""Segments → torch tensors: an ``IterableDataset`` over the segments topic, a JSONL file of
segments, or any iterable of segment events (the optional extra ``titoflow[torch]``; nothing
else in titoflow imports torch).

Every item is one batch of whole sequences (segments), as ``[rows, length]`` tensors:
``input_ids``, ``position_ids`` (restarting at 0 with each sequence), ``sequence_ids`` (which
sequence of the item a position holds, -1 on padding), ``loss_mask``, ``old_logprobs``,
``logprob_source``, ``weight_version`` (per token, :func:`~titoflow.client.batch.version_array`);
per sequence, ``reward`` and ``segment_ids``; ``cu_seqlens`` (flash-attn varlen's offsets over
the rows' real tokens); ``group`` and ``complete``. An item is one segment per row (one segment,
or with ``group_by_instance`` a group), or with ``pack_tokens`` rows packed up to that budget.
An item whose segments hold images (``segment.images``; needs ``image_store``) also has their
vision inputs (:func:`~titoflow.client.image_inputs.image_inputs`): ``pixel_values`` and
``image_grid_thw`` (``[images, 3]``), the images in row-major token order of the item, and per
image ``image_sequence_ids`` (its sequence, as ``sequence_ids`` numbers them) and
``image_runs`` (``[images, 3]``: row, first column, length of its placeholder run in the
layout); an item without images has none of these four keys. With ``mrope`` (a Qwen2-VL,
Qwen2.5-VL or Qwen3-VL policy) every item's ``position_ids`` are ``[4, rows, length]``, as
transformers' Qwen-VL forward takes packed rows: the text positions above, then each sequence's
time, height and width rows (:func:`~titoflow.client.mrope.mrope_position_ids`, equal to the
model's ``get_rope_index`` on that sequence alone), 0 on padding.

Invariants: tokens, masks and logprob bits are the segment's own (built by
:func:`~titoflow.client.batch.segment_arrays`, laid out by :mod:`titoflow.client.packing`,
never split); a segment is in at most one item; with ``group_by_instance`` an item is exactly
one group of :class:`~titoflow.client.groups.GroupCollector`. Over a
:class:`~titoflow.client.topic_source.TopicSource` with a group, a record is held (by
:class:`~titoflow.client.progress.Progress`) from when it is read until the item holding it is
yielded (or it proves to hold nothing to train on: a notice, an unused sample, a group of
discarded sessions); :meth:`SegmentDataset.commit` commits only below every held record, and
:meth:`SegmentDataset.checkpoint` resumes a later run so that each segment is in one item across
restarts. That needs the consumer in the iterating process: with a group, ``num_workers=0``.
An image's pixels are in an item only if they match its recorded grid and placeholder run
(else :class:`~titoflow.client.image_inputs.ImageMismatch`), and a segment with images is never
handed out without them (no ``image_store``: ValueError) nor with text positions (no ``mrope``:
ValueError; the model would place its image tokens as text).
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("titoflow's torch dataset needs torch: pip install titoflow[torch]") from exc

from schemas.events import SegmentFinalized, SessionDiscarded
from titoflow.client.batch import instance_key, segment_arrays, version_array, version_number
from titoflow.client.groups import GROUP_SIZE_KEY, Group, GroupCollector
from titoflow.client.image_inputs import image_inputs
from titoflow.client.mrope import mrope_position_ids
from titoflow.client.packing import lay_out, pack_greedy
from titoflow.client.progress import Position, Progress
from titoflow.client.segment_files import read_jsonl
from titoflow.client.topic_source import TopicSource, TopicStream
from titoflow.image_store import ImageStore

Event = SegmentFinalized | SessionDiscarded
# None in a source: nothing arrived for a while, so timeouts can fire.
Source = Iterable[Event | None]


def recorded_reward(segment: SegmentFinalized) -> float:
    """The reward the driver's finalize carried; NaN if it carried none (named components only,
    or an idle finalize): pass ``reward=`` to combine components or score yourself."""
    return math.nan if segment.reward is None else segment.reward


class SegmentDataset(IterableDataset[dict[str, Any]]):
    def __init__(
        self,
        source: TopicSource | Source | str | Path,
        *,
        pad_id: int,
        pack_tokens: int | None = None,
        group_by_instance: bool = False,
        group_size: int | None = None,
        group_size_key: str = GROUP_SIZE_KEY,
        timeout_s: float | None = None,
        pad_to_multiple_of: int = 1,
        reward: Callable[[SegmentFinalized], float] = recorded_reward,
        version_number: Callable[[str], int] = version_number,
        unused_samples: bool = False,
        clock: Callable[[], float] = time.monotonic,
        image_store: ImageStore | str | Path | None = None,
        mrope: bool = False,
    ) -> None:
        """``source``: a :class:`~titoflow.client.topic_source.TopicSource`, a JSONL file of
        segments (``titoflow replay``'s output; re-read on every pass), or any iterable of
        segments and discard notices. ``pack_tokens``: pack rows up to that many tokens.
        ``group_by_instance``: one item per group, complete when ``group_size`` sessions (or
        the sessions' ``group_size_key`` metadata) have ended. ``timeout_s``: hand out an
        incomplete group, or a packed row that is not full, that long after its first segment
        (None: wait). Segments marked ``unused_sample`` are skipped unless ``unused_samples``.
        ``image_store``: the image store the ingress wrote (TITOFLOW_IMAGE_STORE_DIR), which an
        item of segments with images needs for their ``pixel_values``. ``mrope``: the policy is
        a Qwen2/2.5/3-VL model, whose ``position_ids`` are M-RoPE's (``[4, rows, length]``);
        segments with images need it."""
        if pack_tokens is not None and pack_tokens < 1:
            raise ValueError("pack_tokens must be at least 1")
        self.source = source
        self.pad_id = pad_id
        self.pack_tokens = pack_tokens
        self.group_by_instance = group_by_instance
        self.group_size = group_size
        self.group_size_key = group_size_key
        self.timeout_s = timeout_s
        self.pad_to_multiple_of = pad_to_multiple_of
        self.reward = reward
        self.version_number = version_number
        self.unused_samples = unused_samples
        self.clock = clock
        self.image_store = (
            image_store
            if image_store is None or isinstance(image_store, ImageStore)
            else ImageStore(Path(image_store))
        )
        self.mrope = mrope
        self._pass: tuple[TopicStream, Progress] | None = None  # the live pass over a topic
        self._resumed: dict[str, Any] | None = None  # where the last pass over it ended

    def commit(self) -> None:
        """Commit, in the topic source's consumer group, every record of the items you were
        handed so far, and nothing held back for a later item (an open group, a partly filled
        packed row): per partition, up to the lowest offset still held. Call it once what you
        took is trained on (and saved, if you checkpoint); ``SegmentConsumer.commit``'s errors."""
        stream, progress = self._live("commit()")
        stream.commit(progress.watermark())

    def checkpoint(self) -> dict[str, Any]:
        """JSON-able: where to resume so that every segment is in one item once, as
        ``TopicSource(..., resume=...)``: save it in the same checkpoint as your model."""
        if self._pass is None and self._resumed is not None:
            return self._resumed
        return self._live("checkpoint()")[1].checkpoint()

    def _live(self, what: str) -> tuple[TopicStream, Progress]:
        if not isinstance(self.source, TopicSource) or self.source.group_id is None:
            raise RuntimeError(f"{what} needs a TopicSource with a group_id")
        if self._pass is None:
            raise RuntimeError(f"{what} needs the dataset being iterated")
        return self._pass

    def _release(self, positions: list[Position | None]) -> None:
        if self._pass is not None:
            self._pass[1].release(p for p in positions if p is not None)

    def _emit(
        self,
        segments: list[SegmentFinalized],
        positions: list[Position | None],
        group: str | None,
        complete: bool,
    ) -> dict[str, Any]:
        """The item, its records released: the caller has it once it is yielded."""
        item = self._item(segments, group, complete)
        self._release(positions)
        return item

    def _positioned(self) -> Iterator[tuple[Event | None, Position | None]]:
        if not isinstance(self.source, TopicSource):
            events = read_jsonl(self.source) if isinstance(self.source, str | Path) else self.source
            for event in events:
                yield event, None
            return
        if get_worker_info() is not None and self.source.group_id is not None:
            raise ValueError(
                "SegmentDataset over TopicSource(group_id=...) in a DataLoader worker: its "
                "commit() and checkpoint() must reach the consumer, so use num_workers=0 (the "
                "consumer runs on its own thread already)"
            )
        resume = self._resumed if self._resumed is not None else self.source.resume
        stream = self.source.open(resume)
        progress = Progress(resume)
        self._pass = (stream, progress)
        try:
            for delivered in stream:
                if delivered is None:
                    yield None, None
                elif progress.read(delivered.partition, delivered.offset):
                    yield delivered.event, (delivered.partition, delivered.offset)
        finally:
            if self.source.group_id is not None:
                # A later pass in this process goes on from here, not from the group's commit.
                self._resumed = progress.checkpoint()
            self._pass = None
            stream.close()

    def _events(self) -> Iterator[tuple[Event | None, Position | None]]:
        worker = get_worker_info()
        for event, at in self._positioned():
            # Each data-loader worker takes whole instances (a group never straddles two).
            if (
                worker is None
                or event is None
                or zlib.crc32(instance_key(event).encode()) % worker.num_workers == worker.id
            ):
                yield event, at

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.group_by_instance:
            return self._groups()
        return self._packed() if self.pack_tokens is not None else self._single()

    def _trainable(self, event: Event | None) -> SegmentFinalized | None:
        if isinstance(event, SegmentFinalized) and (self.unused_samples or not event.unused_sample):
            return event
        return None

    def _single(self) -> Iterator[dict[str, Any]]:
        for event, at in self._events():
            segment = self._trainable(event)
            if segment is None:
                self._release([at])
            else:
                yield self._emit([segment], [at], None, True)

    def _packed(self) -> Iterator[dict[str, Any]]:
        assert self.pack_tokens is not None
        row: list[SegmentFinalized] = []
        held: list[Position | None] = []
        started = 0.0
        for event, at in self._events():
            segment = self._trainable(event)
            if segment is None:
                self._release([at])  # a notice or an unused sample: nothing to hold
            else:
                # pack_greedy's rule (and its error for a segment over the budget).
                lengths = [len(s.token_ids) for s in [*row, segment]]
                if len(pack_greedy(lengths, self.pack_tokens)) > 1:
                    yield self._emit(row, held, None, True)
                    row, held = [], []
                if not row:
                    started = self.clock()
                row.append(segment)
                held.append(at)
            if row and self.timeout_s is not None and self.clock() - started >= self.timeout_s:
                yield self._emit(row, held, None, True)
                row, held = [], []
        if row:
            yield self._emit(row, held, None, True)

    def _groups(self) -> Iterator[dict[str, Any]]:
        collector = GroupCollector(
            self.group_size, self.timeout_s, self.group_size_key, self.unused_samples
        )
        held: dict[str, list[Position | None]] = {}  # the records of each open group
        for event, at in self._events():
            now = self.clock()
            done: list[Group | None] = []
            if event is not None:
                held.setdefault(instance_key(event), []).append(at)
                done.append(collector.add(event, now))
            for group in [*filter(None, done), *collector.expired(now)]:
                yield from self._group_item(group, held.pop(group.key))
        for group in collector.flush():
            yield from self._group_item(group, held.pop(group.key))

    def _group_item(
        self, group: Group, positions: list[Position | None]
    ) -> Iterator[dict[str, Any]]:
        if group.segments:
            yield self._emit(group.segments, positions, group.key, group.complete)
        else:  # a group of discarded sessions trains nothing
            self._release(positions)

    def _item(
        self, segments: list[SegmentFinalized], group: str | None, complete: bool
    ) -> dict[str, Any]:
        sequences = [
            {**segment_arrays(s), "weight_version": version_array(s, self.version_number)}
            for s in segments
        ]
        lengths = [len(s.token_ids) for s in segments]
        rows = (
            [[i] for i in range(len(segments))]
            if self.pack_tokens is None
            else pack_greedy(lengths, self.pack_tokens)
        )
        arrays = lay_out(sequences, rows, self.pad_id, self.pad_to_multiple_of)
        item: dict[str, Any] = {key: torch.from_numpy(array) for key, array in arrays.items()}
        item["reward"] = torch.from_numpy(
            np.array([self.reward(s) for s in segments], dtype=np.float32)
        )
        item["segment_ids"] = [s.segment_id for s in segments]
        item["group"] = group
        item["complete"] = complete
        placed = _placed(rows, lengths)
        first = next((s for s in segments if s.images), None)
        if first is not None:
            if self.image_store is None:
                raise ValueError(
                    f"segment {first.segment_id} holds {len(first.images)} images: pass "
                    "SegmentDataset(..., image_store=<the ingress's TITOFLOW_IMAGE_STORE_DIR>) "
                    "to train on their pixels"
                )
            if not self.mrope:
                raise ValueError(
                    f"segment {first.segment_id} holds {len(first.images)} images: a Qwen-VL "
                    "policy places them by M-RoPE position ids, pass SegmentDataset(..., "
                    "mrope=True)"
                )
            item.update(_images(segments, placed, self.image_store))
        if self.mrope:
            item["position_ids"] = _mrope_positions(segments, placed, item["position_ids"])
        return item


def _images(
    segments: list[SegmentFinalized],
    placed: dict[int, tuple[int, int]],
    store: ImageStore,
) -> dict[str, torch.Tensor]:
    """The vision inputs of the item's images, in row-major token order, and where each
    image's run sits in the item's layout."""
    pixels: list[np.ndarray] = []
    grids: list[np.ndarray] = []
    sequences: list[int] = []
    runs: list[tuple[int, int, int]] = []
    for index, segment in enumerate(segments):
        if not segment.images:
            continue
        inputs = image_inputs(segment, store)
        if pixels and pixels[0].shape[1] != inputs.pixel_values.shape[1]:
            raise ValueError(
                f"segment {segment.segment_id}: its images' pixel rows are "
                f"{inputs.pixel_values.shape[1]} wide, those of segment "
                f"{segments[sequences[0]].segment_id} {pixels[0].shape[1]}: one item cannot "
                "mix image processors (keep one policy's segments in a source)"
            )
        pixels.append(inputs.pixel_values)
        grids.append(inputs.image_grid_thw)
        at_row, column = placed[index]
        for record in inputs.records:
            sequences.append(index)
            runs.append((at_row, column + record.offset, record.length))
    return {
        "pixel_values": torch.from_numpy(np.concatenate(pixels, axis=0)),
        "image_grid_thw": torch.from_numpy(np.concatenate(grids, axis=0)),
        "image_sequence_ids": torch.tensor(sequences, dtype=torch.int64),
        "image_runs": torch.tensor(runs, dtype=torch.int64),
    }


def _placed(rows: list[list[int]], lengths: list[int]) -> dict[int, tuple[int, int]]:
    """Each sequence's row and first column in the layout."""
    placed: dict[int, tuple[int, int]] = {}
    for r, row in enumerate(rows):
        column = 0
        for index in row:
            placed[index] = (r, column)
            column += lengths[index]
    return placed


def _mrope_positions(
    segments: list[SegmentFinalized], placed: dict[int, tuple[int, int]], text: torch.Tensor
) -> torch.Tensor:
    """``[4, rows, length]``: ``text`` (the layout's restarting positions), then each
    sequence's M-RoPE rows at its place; 0 on padding."""
    positions = torch.zeros((4, *text.shape), dtype=torch.int64)
    positions[0] = text
    for index, segment in enumerate(segments):
        row, column = placed[index]
        span = slice(column, column + len(segment.token_ids))
        positions[1:, row, span] = torch.from_numpy(mrope_position_ids(segment))
    return positions


def image_tensors(segment: SegmentFinalized, store: ImageStore) -> dict[str, torch.Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of ``segment``'s images in token order, as tensors
    (what slime's and miles' ``multimodal_train_inputs`` and OpenRLHF's ``mm_train_inputs``
    hold)."""
    inputs = image_inputs(segment, store)
    return {
        "pixel_values": torch.from_numpy(inputs.pixel_values),
        "image_grid_thw": torch.from_numpy(inputs.image_grid_thw),
    }


def block_causal_mask(sequence_ids: torch.Tensor) -> torch.Tensor:
    """``[rows, 1, length, length]`` bool: position ``q`` may attend to ``k`` when both hold
    the same sequence and ``k <= q`` (a padding position to itself only, so no softmax row is
    empty). For attention kernels that take a dense mask (Hugging Face's sdpa and eager take
    it as ``attention_mask``); flash-attn's varlen kernels take ``cu_seqlens`` instead."""
    length = sequence_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=sequence_ids.device).tril()
    same = sequence_ids[:, :, None] == sequence_ids[:, None, :]
    real = sequence_ids[:, None, :] >= 0
    alone = torch.eye(length, dtype=torch.bool, device=sequence_ids.device)
    return ((same & causal & real) | alone)[:, None]

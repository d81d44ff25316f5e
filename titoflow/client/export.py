"""Segments as columns: the Parquet file and Hugging Face ``datasets`` directory that
``titoflow export`` writes, and :func:`read_segments`, which gives the segments back.

Invariant: a segment read back equals the segment written, every field, logprobs bit for bit.
The aligned token arrays are typed Arrow lists of the width they have on the wire (int32 ids,
float32 logprobs, uint8 loss mask and logprob source: no value is widened or rounded); the scalar
fields are typed columns; the nested fields a trainer seldom filters on (steps, metadata,
diagnostics, reward components, routed experts, images) are their event JSON in string columns.
docs/trainer.md ("Exporting segments") documents every column; :data:`COLUMNS` is that list.

pyarrow and datasets are the optional extra ``titoflow[export]``: imported only when a function
here is called, and a missing one is said in one line naming the extra.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from schemas.events import SegmentFinalized

INSTALL_HINT = "pip install 'titoflow[export]'"

# Arrow list offsets are int32: a row group must hold fewer list elements than that.
ROW_GROUP_ROWS = 512
ROW_GROUP_TOKENS = 1 << 26
BATCH_ROWS = 256

# (column, Arrow type name, meaning); types: see _arrow_type.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("schema_version", "int8", "the event's schema_version (1)"),
    ("segment_id", "string", "content-derived id: a repeat of a segment has the same one"),
    ("session_id", "string", "the scaffold session"),
    ("chain_id", "string", "the chain of steps (id of its first step)"),
    ("instance_id", "string?", "the prompt/task sampled, if given"),
    ("rollout_id", "string", "metadata rollout_id, else the session"),
    ("channel", "string?", "train, val... as the session was opened"),
    ("event_time", "float64", "unix seconds when the worker made the segment"),
    ("token_ids", "list<int32>", "the exact token ids"),
    ("loss_mask", "list<uint8>", "1 on tokens the policy generated"),
    ("logprobs", "list<float32>", "the engine's logprob per token, the float32 it reported"),
    ("logprob_source", "list<uint8>", "0 none, 1 sampled, 2 constrained, 3 recomputed"),
    ("weight_versions", "list<struct<version: string, start: int32, end: int32>>", "spans"),
    ("finalize_reason", "string", "finalized, idle or size"),
    ("split_reason", "string?", "why the segment does not continue an earlier one"),
    ("build_mode", "string", "concat or last-step"),
    ("reward", "float64?", "the finalize call's reward"),
    ("last_of_session", "bool", "the session's last segment"),
    ("unused_sample", "bool", "a sample nobody continued (retry, unpicked candidate)"),
    ("steps", "json", "SegmentStep list: each step's spans, finish reason and sampling"),
    ("reward_components", "json", "named reward components"),
    ("diagnostics", "json", "divergence and repair counters"),
    ("metadata", "json", "session metadata (open, then finalize)"),
    ("routed_experts", "json?", "MoE routing replay block, as in the event (data base64)"),
    ("images", "json", "ImageRecord list: each image's sha256, run, grid and processor"),
)
_JSON = frozenset(name for name, kind, _ in COLUMNS if kind.startswith("json"))
# The aligned arrays and their numpy dtype: the packed encoding's on the wire (schemas/arrays.py).
ARRAY_DTYPES = {"token_ids": "<i4", "loss_mask": "u1", "logprobs": "<f4", "logprob_source": "u1"}
Arrays = dict[str, np.ndarray]


class ExportUnavailable(RuntimeError):
    """pyarrow or datasets is not installed."""


def _pyarrow() -> Any:  # the pyarrow module (untyped)
    try:
        import pyarrow
        import pyarrow.parquet  # makes pyarrow.parquet an attribute of pyarrow
    except ImportError:
        raise ExportUnavailable(
            f"reading or writing exports needs pyarrow: {INSTALL_HINT}"
        ) from None
    return pyarrow


def _datasets() -> Any:  # the datasets module
    try:
        import datasets
    except ImportError:
        raise ExportUnavailable(
            f"a Hugging Face datasets directory needs datasets: {INSTALL_HINT}"
        ) from None
    return datasets


def require(datasets: bool = False) -> None:
    """Raise :class:`ExportUnavailable` now, not after a long export, if a package is missing."""
    _pyarrow()
    if datasets:
        _datasets()


def _arrow_type(pa: Any, kind: str) -> Any:
    kind = kind.rstrip("?")
    if kind == "json":
        return pa.string()
    if kind.startswith("list<struct"):
        versions = [("version", pa.string()), ("start", pa.int32()), ("end", pa.int32())]
        return pa.list_(pa.struct(versions))
    if kind.startswith("list<"):
        return pa.list_(getattr(pa, kind[5:-1])())
    return getattr(pa, "bool_" if kind == "bool" else kind)()


def arrow_schema() -> Any:
    """The ``pyarrow.Schema`` of an export (nullable exactly where :data:`COLUMNS` says ``?``)."""
    pa = _pyarrow()
    return pa.schema(
        [
            pa.field(name, _arrow_type(pa, kind), nullable=kind.endswith("?"))
            for name, kind, _ in COLUMNS
        ]
    )


def arrays_of(segment: SegmentFinalized) -> Arrays:
    """The segment's aligned arrays as numpy (exact: every value fits its wire dtype)."""
    return {name: np.asarray(getattr(segment, name), dtype) for name, dtype in ARRAY_DTYPES.items()}


def _list_column(pa: Any, rows: list[np.ndarray], dtype: str) -> Any:
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(row) for row in rows], out=offsets[1:])
    values = np.concatenate(rows).astype(dtype, copy=False) if rows else np.empty(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def segments_table(segments: list[SegmentFinalized], arrays: list[Arrays] | None = None) -> Any:
    """A ``pyarrow.Table`` of :data:`COLUMNS`, one row per segment. ``arrays``, when given, are
    each segment's aligned arrays (e.g. decoded straight from the wire's packed base64) and are
    used instead of the segment's lists."""
    pa = _pyarrow()
    schema = arrow_schema()
    if arrays is None:
        arrays = [arrays_of(segment) for segment in segments]
    dumped = [segment.model_dump(mode="json", exclude=set(ARRAY_DTYPES)) for segment in segments]
    columns: list[Any] = []
    for field in schema:
        if field.name in ARRAY_DTYPES:
            rows = [row[field.name] for row in arrays]
            columns.append(_list_column(pa, rows, ARRAY_DTYPES[field.name]))
        elif field.name in _JSON:
            texts = [_json_text(row[field.name]) for row in dumped]
            columns.append(pa.array(texts, type=field.type))
        else:
            columns.append(pa.array([row[field.name] for row in dumped], type=field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


class ParquetWriter:
    """Segments appended to a Parquet file in row groups of at most ``ROW_GROUP_ROWS`` segments
    or ``ROW_GROUP_TOKENS`` tokens; usable as a context manager. zstd without dictionary pages:
    token ids and logprobs do not repeat, and dictionaries cost time and bytes
    (bench/export.py)."""

    def __init__(self, path: Path) -> None:
        pa = _pyarrow()
        self.path = path
        self._writer = pa.parquet.ParquetWriter(
            str(path), arrow_schema(), compression="zstd", use_dictionary=False
        )
        self._segments: list[SegmentFinalized] = []
        self._arrays: list[Arrays] = []
        self._tokens = 0
        self.rows = 0

    def write(self, segment: SegmentFinalized, arrays: Arrays | None = None) -> None:
        """Append ``segment``; ``arrays`` (see :func:`segments_table`) replace its lists."""
        arrays = arrays if arrays is not None else arrays_of(segment)
        self._segments.append(segment)
        self._arrays.append(arrays)
        self._tokens += len(arrays["token_ids"])
        if len(self._segments) >= ROW_GROUP_ROWS or self._tokens >= ROW_GROUP_TOKENS:
            self.flush()

    def flush(self) -> None:
        if self._segments:
            self._writer.write_table(segments_table(self._segments, self._arrays))
            self.rows += len(self._segments)
            self._segments, self._arrays, self._tokens = [], [], 0

    def close(self) -> None:
        self.flush()
        self._writer.close()

    def __enter__(self) -> ParquetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_parquet(segments: Iterable[SegmentFinalized], path: Path) -> int:
    """Write ``segments`` to a Parquet file; returns how many."""
    with ParquetWriter(path) as writer:
        for segment in segments:
            writer.write(segment)
    return writer.rows


def parquet_to_datasets(parquet: Path, directory: Path) -> None:
    """Save a Parquet export as a Hugging Face ``datasets`` directory (``save_to_disk``'s
    layout, loaded by ``datasets.load_from_disk``), streamed through a scratch cache, without
    datasets' own progress bars (the caller reports progress)."""
    datasets = _datasets()
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        pq = _pyarrow().parquet
        if pq.ParquetFile(parquet).metadata.num_rows == 0:
            # from_parquet refuses a file without rows, and save_to_disk writes no shard for an
            # empty dataset (which load_from_disk refuses): one empty shard, the columns kept.
            empty = datasets.Dataset(datasets.table.InMemoryTable(pq.read_table(parquet)))
            empty.save_to_disk(str(directory), num_shards=1)
            return
        with tempfile.TemporaryDirectory(prefix="titoflow-export-") as cache:
            dataset = datasets.Dataset.from_parquet(str(parquet), cache_dir=cache)
            dataset.save_to_disk(str(directory))
            del dataset  # its cache files go with the scratch directory
    finally:
        if bars:
            datasets.enable_progress_bars()


def read_segments(path: Path | str) -> Iterator[SegmentFinalized]:
    """The segments of an export, in the order written: a Parquet file, or a ``datasets``
    directory. A row of an unknown ``schema_version`` raises (pydantic's ValidationError)."""
    for batch in _record_batches(Path(path)):
        columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        for row in range(batch.num_rows):
            fields = {name: values[row] for name, values in columns.items()}
            for name in _JSON:
                if fields.get(name) is not None:
                    fields[name] = json.loads(fields[name])
            yield SegmentFinalized.model_validate(fields)


def _record_batches(path: Path) -> Iterator[Any]:
    if path.is_dir():
        dataset = _datasets().load_from_disk(str(path)).with_format("arrow")
        yield from dataset.iter(batch_size=BATCH_ROWS)
        return
    yield from _pyarrow().parquet.ParquetFile(str(path)).iter_batches(batch_size=BATCH_ROWS)

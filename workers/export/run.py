"""The export loop: records from a source, parsed as segments-topic events, each segment once
into the Parquet writer; and the summary a person reads (stderr).

Invariants:
- Every record is parsed as a segments-topic event (its packed arrays decoded into numpy
  without a detour through Python lists, bit for bit); one that is not (or has a schema version
  this titoflow does not know) stops the export with where it was, never skipped silently.
- A segment whose ``segment_id`` was written already (a worker's at-least-once repeat, the
  same bytes) is counted and not written again; ``session_discarded`` notices are counted and
  not written (they carry no tokens).
"""

from __future__ import annotations

import base64
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from pydantic import ValidationError

from schemas.events import SegmentFinalized, SessionDiscarded, segments_topic_adapter
from titoflow.client.export import (
    ARRAY_DTYPES,
    Arrays,
    ParquetWriter,
    parquet_to_datasets,
    require,
)
from workers.export.sources import Read
from workers.replay.errors import ReplayError


@dataclass
class ExportReport:
    records: int = 0
    segments: int = 0
    duplicates: int = 0
    notices: int = 0  # session_discarded: sessions that yielded no segment
    tokens: int = 0
    event_bytes: int = 0  # the written segments' event JSON, as read
    elapsed_s: float = 0.0
    written_bytes: int = 0  # the Parquet file's size

    @property
    def segments_per_s(self) -> float:
        return self.segments / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Event megabytes (10^6) read and written per second."""
        return self.event_bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0


def parse(value: bytes) -> tuple[SegmentFinalized | SessionDiscarded, Arrays | None]:
    """A segments-topic event, and for a segment its aligned arrays decoded from the wire's
    packed base64 straight into numpy; the segment returned then holds empty lists in their
    place (building millions of Python floats and ints was most of an export's time,
    bench/export.py). Raises ValueError (pydantic's ValidationError is one) for anything else."""
    fields = orjson.loads(value)
    arrays: Arrays = {}
    if isinstance(fields, dict) and fields.get("type") == "segment_finalized":
        for name, dtype in ARRAY_DTYPES.items():
            packed = fields.get(name)
            if isinstance(packed, str):  # else a list, validated by the model as usual
                arrays[name] = np.frombuffer(base64.b64decode(packed, validate=True), dtype)
                fields[name] = []
    event = segments_topic_adapter.validate_python(fields)
    if not isinstance(event, SegmentFinalized):
        return event, None
    for name, dtype in ARRAY_DTYPES.items():
        if name not in arrays:
            arrays[name] = np.asarray(getattr(event, name), dtype)
    return event, arrays


def _why(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
    return str(exc)


async def export(reads: AsyncIterator[Read], writer: ParquetWriter) -> ExportReport:
    """Write every distinct segment of ``reads`` to ``writer`` (which the caller closes)."""
    began = time.monotonic()
    report = ExportReport()
    seen: set[str] = set()
    async for read in reads:
        report.records += 1
        try:
            event, arrays = parse(read.value)
        except ValueError as exc:
            raise ReplayError(
                f"{read.where}: not a segments-topic event this titoflow reads ({_why(exc)})"
            ) from None
        if arrays is None:
            report.notices += 1
            continue
        assert isinstance(event, SegmentFinalized)
        if event.segment_id in seen:
            report.duplicates += 1
            continue
        seen.add(event.segment_id)
        writer.write(event, arrays)
        report.segments += 1
        report.tokens += len(arrays["token_ids"])
        report.event_bytes += len(read.value)
    writer.flush()
    report.elapsed_s = time.monotonic() - began
    return report


def format_summary(report: ExportReport, wrote: list[str]) -> str:
    """What an export did, for a person."""
    return "\n".join(
        [
            f"records read: {report.records}, segments written: {report.segments} "
            f"({report.tokens} tokens), repeats dropped: {report.duplicates}, "
            f"discard notices: {report.notices}",
            f"{report.event_bytes / 1e6:.1f} MB of events in {report.elapsed_s:.2f}s: "
            f"{report.segments_per_s:.0f} segments/s, {report.mb_per_s:.1f} MB/s",
            *[f"wrote {target}" for target in wrote],
        ]
    )


async def export_files(
    reads: AsyncIterator[Read], parquet: Path | None, directory: Path | None
) -> tuple[ExportReport, list[str]]:
    """Export to a Parquet file and/or a ``datasets`` directory, each put in place only once
    complete (written beside its target first), and say what was written."""
    targets = [target for target in (parquet, directory) if target is not None]
    if not targets:
        raise ReplayError("give --parquet FILE, --datasets DIR or both")
    require(datasets=directory is not None)
    for target in targets:
        if not target.parent.is_dir():
            raise ReplayError(f"{target}: directory {target.parent} does not exist")
    if directory is not None and directory.exists() and not _replaceable(directory):
        raise ReplayError(f"{directory} exists and is not a datasets directory: give a new path")
    with tempfile.TemporaryDirectory(prefix=".titoflow-export-", dir=targets[0].parent) as scratch:
        written = Path(scratch) / "segments.parquet"
        with ParquetWriter(written) as writer:
            report = await export(reads, writer)
        report.written_bytes = written.stat().st_size
        wrote = []
        if directory is not None:
            staged = Path(scratch) / "datasets"
            parquet_to_datasets(written, staged)
            if directory.exists():
                shutil.rmtree(directory)
            shutil.move(staged, directory)
            wrote.append(f"{directory} (datasets.load_from_disk)")
        if parquet is not None:
            shutil.move(written, parquet)
            wrote.append(f"{parquet} ({report.written_bytes / 1e6:.1f} MB of Parquet)")
    return report, wrote


def _replaceable(directory: Path) -> bool:
    """An empty directory, or an earlier export's (``save_to_disk`` wrote its state.json)."""
    return directory.is_dir() and (
        (directory / "state.json").exists() or not any(directory.iterdir())
    )

"""``titoflow export`` (workers/export, titoflow/client/export.py): segments → Parquet and a
Hugging Face ``datasets`` directory → loaded back with pyarrow and ``datasets.load_from_disk``:
identical token ids, masks and logprob bits (compared as the float32 bit patterns of the wire's
packed arrays, not approximately); the live topic on real tansu, a time window of it, a
replay's JSONL; and the errors a person gets in one line."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.main import main
from schemas.events import SegmentFinalized, SessionDiscarded
from tests.support.doc_blocks import blocks_run_by
from tests.support.factories import filled_segment
from titoflow.bus import Publisher
from titoflow.client.export import COLUMNS, read_segments, write_parquet
from titoflow.settings import PROJECT_ROOT, Settings
from workers.replay.sinks import segment_bytes

WIRE_DTYPES = {"token_ids": "<i4", "loss_mask": "u1", "logprobs": "<f4", "logprob_source": "u1"}


def wire_array(segment: SegmentFinalized, name: str) -> np.ndarray:
    """The packed array as the event carries it on the wire (base64 of little-endian values)."""
    packed = json.loads(segment_bytes(segment))[name]
    return np.frombuffer(base64.b64decode(packed), dtype=WIRE_DTYPES[name])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as bytes: float32 compared by bit pattern (NaN, -0.0 and subnormals included)."""
    return a.dtype.itemsize == b.dtype.itemsize and a.tobytes() == b.tobytes()


float32s = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    logprobs=st.lists(st.lists(float32s, min_size=0, max_size=40), min_size=1, max_size=5),
    reward=st.none() | st.floats(allow_nan=False),
    experts=st.booleans(),
)
def test_parquet_round_trip_keeps_every_field_and_the_logprob_bits(
    tmp_path_factory: pytest.TempPathFactory,
    logprobs: list[list[float]],
    reward: float | None,
    experts: bool,
) -> None:
    segments = [
        filled_segment(f"s{i}", lps, reward=reward, experts=experts, instance=None if i else "p")
        for i, lps in enumerate(logprobs)
    ]
    path = tmp_path_factory.mktemp("rt") / "segments.parquet"
    assert write_parquet(segments, path) == len(segments)

    table = pq.read_table(path)
    assert table.schema.names == [name for name, _, _ in COLUMNS]
    for row, segment in enumerate(segments):
        for name, dtype in WIRE_DTYPES.items():
            stored = table.column(name)[row].values.to_numpy(zero_copy_only=False)
            assert stored.dtype == np.dtype(dtype).newbyteorder("=")
            assert same_bits(stored.astype(dtype), wire_array(segment, name)), name

    for original, back in zip(segments, read_segments(path), strict=True):
        for name in WIRE_DTYPES:
            assert same_bits(wire_array(back, name), wire_array(original, name)), name
        # Every other field equal (logprobs may hold NaN, which == cannot compare).
        assert back.model_dump(exclude={"logprobs"}) == original.model_dump(exclude={"logprobs"})


def test_a_datasets_directory_loads_with_load_from_disk_bit_for_bit(tmp_path: Path) -> None:
    special = [
        -0.0,
        float("-inf"),
        float("nan"),
        1e-45,
        -3.4028234663852886e38,
        -0.6931471824645996,
    ]
    segments = [
        filled_segment("a", special, experts=True),
        filled_segment("b", [-1.25, -2.5], instance=None, reward=None),
    ]
    lines = tmp_path / "segments.jsonl"
    lines.write_bytes(b"".join(segment_bytes(s) + b"\n" for s in segments))
    out = tmp_path / "ds"
    assert main(["export", "--from-jsonl", str(lines), "--datasets", str(out)]) == 0

    dataset = datasets.load_from_disk(str(out))
    assert dataset.num_rows == 2
    assert dataset.features["logprobs"].feature.dtype == "float32"
    as_numpy = dataset.with_format("numpy")
    for row, segment in enumerate(segments):
        for name, dtype in WIRE_DTYPES.items():
            loaded = np.asarray(as_numpy[row][name])
            assert same_bits(loaded.astype(dtype), wire_array(segment, name)), name
    assert [segment_bytes(s) for s in read_segments(out)] == [segment_bytes(s) for s in segments]


def test_an_export_of_no_segments_is_an_empty_dataset_with_every_column(tmp_path: Path) -> None:
    """A time window nobody trained in (docs/trainer.md's example): empty Parquet and an empty
    datasets directory that loads, not datasets' "corresponds to no data" traceback."""
    lines = tmp_path / "none.jsonl"
    lines.write_bytes(b"")
    parquet, out = tmp_path / "none.parquet", tmp_path / "none-ds"
    argv = ["export", "--from-jsonl", str(lines), "--parquet", str(parquet), "--datasets", str(out)]
    assert main(argv) == 0
    dataset = datasets.load_from_disk(str(out))
    assert dataset.num_rows == 0
    assert list(dataset.features) == [name for name, _, _ in COLUMNS]
    assert list(read_segments(out)) == list(read_segments(parquet)) == []


def test_the_export_module_is_not_imported_by_the_core_and_names_its_extra(
    tmp_path: Path,
) -> None:
    probe = (
        "import sys; import cli.main, titoflow.client.export, titoflow.client.consumer; "
        "print(sorted(m for m in ('pyarrow', 'datasets') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, check=True
    )
    assert done.stdout.strip() == b"[]"
    # Without pyarrow, the command says which extra to install, in one line.
    lines = tmp_path / "segments.jsonl"
    lines.write_bytes(segment_bytes(filled_segment("a", [-1.0])) + b"\n")
    blocked = (
        "import sys; sys.modules['pyarrow'] = None; from cli.main import main; sys.exit(main())"
    )
    argv = ["export", "--from-jsonl", str(lines), "--parquet", str(tmp_path / "x.parquet")]
    done = subprocess.run(
        [sys.executable, "-c", blocked, *argv], cwd=PROJECT_ROOT, capture_output=True, check=False
    )
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "titoflow export: reading or writing exports needs pyarrow: pip install 'titoflow[export]'"
    ]
    assert not (tmp_path / "x.parquet").exists()
    # Without datasets, a --datasets export says so before reading anything.
    blocked = blocked.replace("'pyarrow'", "'datasets'")
    argv += ["--datasets", str(tmp_path / "ds")]
    done = subprocess.run(
        [sys.executable, "-c", blocked, *argv], cwd=PROJECT_ROOT, capture_output=True, check=False
    )
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "titoflow export: a Hugging Face datasets directory needs datasets: "
        "pip install 'titoflow[export]'"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["segments.jsonl"]


def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "segments.jsonl"
    lines.write_bytes(segment_bytes(filled_segment("a", [-1.0])) + b'\n{"type": "step_recorded"}\n')
    out = tmp_path / "out.parquet"
    assert main(["export", "--from-jsonl", str(lines), "--parquet", str(out)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"titoflow export: {lines}:2: not a segments-topic event")
    assert not out.exists() and list(tmp_path.iterdir()) == [lines]  # no scratch left either

    assert main(["export", "--from-jsonl", str(lines)]) == 2
    assert "give --parquet FILE, --datasets DIR or both" in capsys.readouterr().err
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "mine.txt").write_text("not an export")
    assert main(["export", "--from-jsonl", str(lines), "--datasets", str(tmp_path / "keep")]) == 2
    assert "is not a datasets directory" in capsys.readouterr().err
    assert (tmp_path / "keep" / "mine.txt").exists()


async def publish_segments(
    settings: Settings, events: Sequence[SegmentFinalized | SessionDiscarded]
) -> None:
    publisher = Publisher(settings)
    try:
        for event in events:
            key = event.instance_id or event.session_id  # as the worker keys them
            await publisher.publish(
                settings.topic("segments"), key, event.model_dump_json().encode()
            )
    finally:
        await publisher.stop()


async def cli(*argv: str) -> int:
    """``titoflow ...`` in this process (in a thread: the CLI runs its own event loop)."""
    return await asyncio.to_thread(main, list(argv))


async def test_live_topic_and_a_time_window_of_it_on_tansu(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    early = [filled_segment(f"e{i}", [-0.5 * i, -1.0], instance=f"p{i % 2}") for i in range(4)]
    late = [filled_segment(f"l{i}", [-0.25, -3.0 * i], instance=f"p{i % 2}") for i in range(3)]
    notice = SessionDiscarded(session_id="gone", event_time=1.0, reason="empty")
    # A worker's at-least-once repeat (same id, same bytes) and a discard notice ride along.
    await publish_segments(settings, [*early, early[0], notice])
    await asyncio.sleep(0.5)
    boundary = time.time()
    await asyncio.sleep(0.5)
    await publish_segments(settings, late)
    flags = [
        "--bootstrap-servers",
        settings.bootstrap_servers,
        "--topic-prefix",
        settings.topic_prefix,
    ]

    async def exported(*argv: str) -> list[SegmentFinalized]:
        out = tmp_path / f"export-{len(list(tmp_path.iterdir()))}.parquet"
        assert (
            await cli("export", "--parquet", str(out), "--progress", "always", *argv, *flags) == 0
        )
        return list(read_segments(out))

    def ids(segments: list[SegmentFinalized]) -> list[str]:
        return sorted(s.segment_id for s in segments)

    everything = await exported()
    assert ids(everything) == ids(early + late)
    by_id = {s.segment_id: s for s in everything}
    for original in early + late:
        assert segment_bytes(by_id[original.segment_id]) == segment_bytes(original)
    err = capsys.readouterr().err
    assert "segments written: 7 " in err and "repeats dropped: 1, discard notices: 1" in err
    assert "segments/s" in err and "MB/s" in err
    assert "records" in err  # the progress line

    assert ids(await exported("--from-time", str(boundary))) == ids(late)
    assert ids(await exported("--to-time", str(boundary))) == ids(early)
    assert await exported("--from-time", str(boundary + 3600)) == []
    assert ids(await exported("--topic", settings.topic("segments"))) == ids(early + late)
    assert await cli("export", "--parquet", "x", "--topic", "nowhere", *flags) == 2
    assert "topic 'nowhere' does not exist" in capsys.readouterr().err
    window = ["--from-time", str(boundary), "--to-time", str(boundary - 1)]
    assert await cli("export", "--parquet", "x", *window, *flags) == 2
    assert "--to-time must be after --from-time" in capsys.readouterr().err
    assert await cli("export", "--parquet", "x", "--to-time", "yesterday", *flags) == 2
    assert "--to-time 'yesterday'" in capsys.readouterr().err


def test_the_documented_columns_are_the_written_ones() -> None:
    """docs/trainer.md's table of export columns lists exactly :data:`COLUMNS`, in order."""
    text = (PROJECT_ROOT / "docs" / "trainer.md").read_text()
    section = text.split("## Exporting segments", 1)[1].split("\n## ", 1)[0]
    documented = [
        line.split("|")[1].strip().strip("`")
        for line in section.splitlines()
        if line.startswith("| `")
    ]
    assert documented == [name for name, _, _ in COLUMNS]


def test_the_reading_example_of_the_docs_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [example] = blocks_run_by("tests/workers/test_export.py")
    segments = [filled_segment("a", [-1.0, -0.5]), filled_segment("b", [-2.0])]
    lines = tmp_path / "segments.jsonl"
    lines.write_bytes(b"".join(segment_bytes(s) + b"\n" for s in segments))
    monkeypatch.chdir(tmp_path)
    argv = ["export", "--from-jsonl", str(lines), "--parquet", "segments.parquet"]
    assert main([*argv, "--datasets", "segments-ds"]) == 0
    namespace: dict[str, object] = {}
    exec(compile(example, "docs/trainer.md", "exec"), namespace)
    assert namespace["segments"] == segments
    assert namespace["logprobs"].dtype == np.float32  # type: ignore[attr-defined]

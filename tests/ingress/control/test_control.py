"""The control plane's plain parts, tested directly: the state machine, the gate, version
stamping and stitching of pieces, masking of stale versions, command parsing. The real-engine
behaviour is in tests/e2e/test_e2e_control.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ingress.control.control_state import ControlState, PauseGate
from ingress.control.pausable_engine import _Pieces
from schemas.control import (
    AnyControl,
    EngineAdded,
    Pause,
    Resume,
    SetWeightVersion,
    control_adapter,
)
from schemas.events import VersionSpan
from titoflow.control import control_event
from titoflow.engine.api import GenerationChunk
from titoflow.errors import Paused
from workers.versions import mask_stale_versions


def test_state_folds_the_log_and_counts_pauses() -> None:
    state = ControlState()
    assert state.snapshot()["state"] == "running" and state.version is None
    assert state.apply(SetWeightVersion(event_time=0, version="v1"), 0)
    assert state.apply(Pause(event_time=0, mode="keep"), 1)
    assert not state.apply(Pause(event_time=0, mode="keep"), 2)  # repeated: no new pause
    assert state.apply(Pause(event_time=0, mode="abort"), 3)  # same pause, harsher mode
    assert (state.paused, state.mode, state.pauses, state.offset) == (True, "abort", 1, 3)
    assert state.apply(Resume(event_time=0), 4)
    assert not state.apply(Resume(event_time=0), 5)
    state.apply(Pause(event_time=0), 6)
    assert state.snapshot() == {
        "state": "paused",
        "mode": "keep",
        "weight_version": "v1",
        "pauses": 2,
        "control_offset": 6,
    }


def test_a_replica_replaying_the_log_reaches_the_same_state() -> None:
    log: list[AnyControl] = [
        SetWeightVersion(event_time=0, version="v1"),
        Pause(event_time=0, mode="abort"),
        SetWeightVersion(event_time=0, version="v2"),
    ]
    first, second = ControlState(), ControlState()
    for offset, event in enumerate(log):
        first.apply(event, offset)
    for offset, raw in enumerate(e.model_dump_json() for e in log):
        second.apply(control_adapter.validate_json(raw), offset)
    assert first.snapshot() == second.snapshot()


async def test_gate_holds_new_requests_until_resume_or_the_bound() -> None:
    gate = PauseGate(ControlState(), hold_s=0.2)
    await gate.admit()  # running: at once
    gate.apply(Pause(event_time=0))
    with pytest.raises(Paused) as refused:
        await gate.admit()
    assert refused.value.retryable and gate.held == 0
    waiting = asyncio.create_task(gate.admit())
    resumed = asyncio.create_task(gate.wait_resumed())
    await asyncio.sleep(0)
    assert gate.held == 2
    gate.apply(Resume(event_time=0))
    await asyncio.gather(waiting, resumed)
    assert gate.held == 0


async def test_gate_tells_whether_a_pause_came() -> None:
    gate = PauseGate(ControlState(), hold_s=1.0)
    assert not await gate.wait_pause_after(0, timeout_s=0.05)
    later = asyncio.get_running_loop().call_later(0.05, gate.apply, Pause(event_time=0))
    assert await gate.wait_pause_after(0, timeout_s=5.0)
    later.cancel()


def _chunk(ids: list[int]) -> GenerationChunk:
    return GenerationChunk(ids, [-0.5] * len(ids), [[] for _ in ids])


def test_pieces_shift_engine_spans_and_stamp_unversioned_ones() -> None:
    pieces = _Pieces()
    pieces.add_tokens(_chunk([1, 2, 3]))
    pieces.add_spans([VersionSpan(version="v1", start=0, end=3)], 0, "ignored")
    pieces.add_tokens(_chunk([4, 5]))
    pieces.add_spans(
        [VersionSpan(version="v1", start=0, end=1), VersionSpan(version="v2", start=1, end=2)],
        3,
        None,
    )
    pieces.add_tokens(_chunk([6]))
    pieces.add_spans([], 5, "v2")  # an engine without spans: the control log's version
    assert [(s.version, s.start, s.end) for s in pieces.spans] == [("v1", 0, 4), ("v2", 4, 6)]
    assert pieces.token_ids == [1, 2, 3, 4, 5, 6]


def test_masking_keeps_only_the_latest_version() -> None:
    spans = [
        VersionSpan(version="v1", start=1, end=3),
        VersionSpan(version="v2", start=4, end=6),
    ]
    assert mask_stale_versions([0, 1, 1, 0, 1, 1], spans) == [0, 0, 0, 0, 1, 1]
    assert mask_stale_versions([0, 1], []) == [0, 1]


def test_commands_parse_or_name_what_is_wrong() -> None:
    event = control_event({"type": "pause", "mode": "abort"}, issued_by="test")
    assert isinstance(event, Pause) and event.mode == "abort" and event.issued_by == "test"
    with pytest.raises(ValueError, match="mode"):
        control_event({"type": "pause", "mode": "wait"}, issued_by="test")
    with pytest.raises(ValueError):
        control_event({"type": "reboot"}, issued_by="test")
    added = control_event(
        {"type": "engine_added", "url": "http://e:8000", "weight": 0.1}, issued_by="test"
    )
    assert isinstance(added, EngineAdded) and (added.backend, added.weight) == ("vllm", 0.1)
    wrongs: list[tuple[dict[str, Any], str]] = [
        ({"type": "engine_added", "url": "http://e", "weight": 0}, "weight"),
        ({"type": "engine_added", "url": "http://e", "backend": "tgi"}, "backend"),
        ({"type": "engine_drained", "url": "e:8000"}, "url"),
        ({"type": "engine_removed"}, "url"),
    ]
    for wrong, field in wrongs:
        with pytest.raises(ValueError, match=field):
            control_event(wrong, issued_by="test")

"""``titoflow up --demo`` on the real stack with the agentic policy: the demo's agent loop shows a
tool call, the tool result turn and the answer, and the session's one segment holds both turns
(checked against the engine by the witness); with logging as ``up`` sets it, no library's log
line comes between the demo's lines."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.demo import COMMAND, run_demo
from cli.dev.stack import start_ingress, start_worker
from cli.flags import QUIET_LIBRARIES
from titoflow.logs import setup_logging
from titoflow.settings import Settings

pytestmark = pytest.mark.engine


@pytest.fixture
def logging_restored() -> Iterator[None]:
    root, ours = logging.getLogger(), logging.getLogger("titoflow")
    handlers, levels = root.handlers[:], (root.level, ours.level)
    yield
    root.handlers[:] = handlers
    root.setLevel(levels[0])
    ours.setLevel(levels[1])


async def test_the_demo_shows_a_tool_loop_and_its_segment(
    agent_stack_settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    logging_restored: None,
) -> None:
    ingress, url = start_ingress(agent_stack_settings, tmp_path)
    worker = start_worker(agent_stack_settings, tmp_path)
    # As `titoflow up` at the default level: its own lines at INFO, libraries' kept out.
    setup_logging("INFO", "json", QUIET_LIBRARIES)
    try:
        segment = await run_demo(agent_stack_settings, url, color=False)
    finally:
        ingress.stop()
        worker.stop()
    captured = capsys.readouterr()
    logged = [json.loads(line)["logger"] for line in captured.err.splitlines() if line[:1] == "{"]
    assert all(name.startswith("titoflow") for name in logged), captured.err
    shown = captured.out
    arguments = json.dumps({"command": COMMAND})
    assert f"tool call:   bash({arguments})" in shown, shown
    assert "tool result: 'hello from titoflow'" in shown, shown
    assert "<tool_call>" in shown and "<tool_response>" in shown, shown
    # One trajectory, one segment: the tool call and the answer after its result, both trained.
    assert len(segment.steps) == 2 and segment.split_reason is None
    assert segment.last_of_session and sum(segment.loss_mask) > 0

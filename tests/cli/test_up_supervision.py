"""``titoflow up`` supervises its children, on the real stack (its own tansu, the session's vLLM
engine): a SIGKILLed worker, ingress or recompute stage is reported at once (name, exit status,
log file) and restarted, and the stack still serves (a turn after the worker's restart becomes a
segment; the ingress answers again at the same address); the memory-only broker's death stops the
stack with one line saying its data is gone. The engine's restart is tests/cli/test_supervisor.py's
(a real engine takes minutes to start)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from cli.dev.procs import ManagedProcess
from tests.support.processes import descendant_running, descendants, running
from tests.support.topics import finalized_segments
from titoflow.settings import Settings

pytestmark = pytest.mark.engine


def kill_and_see_restarted(up: ManagedProcess, name: str, pid: int, run: Path) -> int:
    """SIGKILL ``pid`` (``up``'s child ``name``); the pid of its successor, once ``up`` said
    what died and that it restarted it."""
    log = run / "logs" / f"{name}.log"
    exited = f"titoflow up: {name} exited (killed by SIGKILL); log: {log}"
    restarted = re.compile(rf"titoflow up: {name} restarted \(pid (\d+)\)")
    seen = len(up.log_tail(1_000_000))
    signal_sent = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    up.wait_until(lambda: exited in up.log_tail(1_000_000)[seen:], 10, f"{name}'s exit reported")
    # Polled every 0.2 s: reported at once.
    assert time.monotonic() - signal_sent < 3
    up.wait_until(
        lambda: restarted.search(up.log_tail(1_000_000)[seen:]) is not None, 10, f"{name} back"
    )
    match = restarted.search(up.log_tail(1_000_000)[seen:])
    assert match is not None
    successor = int(match.group(1))
    assert successor != pid and running(successor)
    return successor


async def a_turn(url: str, session: str) -> None:
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    try:
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    finally:
        await client.close()


async def test_up_restarts_what_dies_and_stops_when_its_broker_dies(
    engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    up = ManagedProcess(
        "up",
        [sys.executable, "-m", "cli", "up", "--run-dir", str(run)],
        tmp_path / "up.log",
        {
            "TITOFLOW_ENGINE_URL": engine_url,
            "TITOFLOW_MODEL_PATH": str(model_dir),
            "TITOFLOW_BOOTSTRAP_SERVERS": "",
            "TITOFLOW_LOG_FORMAT": "text",
            "PYTHONUNBUFFERED": "1",
        },
    )
    try:
        up.wait_until(lambda: "Ctrl-C stops everything" in up.log_tail(), 120, "the stack up")
        shown = up.log_tail(1_000_000)
        url_match = re.search(r"OpenAI:\s+(\S+)/sess/my-session/v1", shown)
        broker_match = re.search(r"broker:\s+(\S+)", shown)
        assert url_match and broker_match, shown
        url = url_match.group(1)
        settings = Settings(
            bootstrap_servers=broker_match.group(1),
            driver_token=(run / "driver-token").read_text().strip(),
            model_path=model_dir,
        )

        worker = descendant_running(up.pid, "-m", "cli", "worker")
        kill_and_see_restarted(up, "worker0", worker, run)
        # The stack still builds segments: a turn after the restart becomes one.
        session = f"after-restart-{uuid.uuid4().hex[:8]}"
        await a_turn(url, session)
        (segment,) = await finalized_segments(settings, url, session)
        assert segment.session_id == session and segment.last_of_session

        ingress = descendant_running(up.pid, "-m", "cli", "ingress")
        kill_and_see_restarted(up, "ingress", ingress, run)
        async with httpx.AsyncClient() as http:  # the same address serves again
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await http.get(f"{url}/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, up.log_tail()
                await asyncio.sleep(0.2)
        await a_turn(url, f"after-ingress-{uuid.uuid4().hex[:8]}")

        recompute = descendant_running(up.pid, "-m", "cli", "recompute")
        kill_and_see_restarted(up, "recompute", recompute, run)

        children = descendants(up.pid)
        broker = descendant_running(up.pid, "--storage-engine", "memory://tansu/")
        os.kill(broker, signal.SIGKILL)
        assert up.proc.wait(30) == 1, up.log_tail()
        said = up.log_tail()
        assert f"titoflow up: broker exited (killed by SIGKILL); log: {run / 'logs'}" in said
        assert (
            "titoflow up: broker (tansu, memory storage) died: every step, segment and "
            "committed offset it held is gone; stopping the stack"
        ) in said
        assert not [pid for pid in children if running(pid)]
    finally:
        up.stop()  # its children too, if the test failed halfway

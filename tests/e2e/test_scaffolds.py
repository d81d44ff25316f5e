"""Real, unmodified agent scaffolds run real tool loops through titoflow, in the default run.

Claude Code (default mode and ``--bare``), OpenCode (its OpenAI-compatible and Anthropic
providers), Codex (Responses API) — pinned versions that ``scripts/setup-scaffolds.sh`` installs
into ``.tools/npm`` — and the openai-agents SDK (a Python scaffold) each get a fresh session as
their base URL and one task that names a tool and a command. The policy is the tiny agentic one
(:mod:`cli.dev.agent_policy`): it calls the tool, reads the result and ends its turn. Each run
must:

* end with the client's own success signal (exit 0, no error event);
* make at least two model calls — the tool call, then the answer after the tool result — and
  the command must really have run (it creates a file in the client's work directory);
* leave segments that hold exactly what the engine sampled (the witness check of conftest, on
  the driver's finalize), one per trajectory unless the scaffold rewrote its history.

What each scaffold did (model calls, segments, split reasons and divergence classes) is printed
for ``pytest -rP`` and written up in docs/scaffolds.md. Every client is kept offline: its own
home and config directories, the documented switches that turn off telemetry, update checks,
plugin and model-list downloads, and an npm registry pointed at a closed loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.dev.procs import ManagedProcess
from cli.dev.stack import start_ingress, start_worker
from schemas.events import SegmentFinalized, StepRecorded, steps_topic_adapter
from tests.support.topics import finalized_segments, read_all
from titoflow.client.rollout import RolloutClient
from titoflow.settings import PROJECT_ROOT, Settings
from titoflow.tito.tokenizer import load_tokenizer

TOOLS_BIN = PROJECT_ROOT / ".tools" / "npm" / "bin"
CLIENT_TIMEOUT_S = 300.0
# The command each task names; it leaves a file behind, so the test sees that it really ran.
MARKER = "hello.txt"
COMMAND = f"touch {MARKER}"
# Completion budget per call: the policy ends its turns on its own in a few dozen tokens; the
# budget only bounds a run that goes wrong.
MAX_OUTPUT_TOKENS = 256
# A closed port on loopback: any registry download a client attempts fails at once, offline.
DEAD_REGISTRY = "http://127.0.0.1:9/"

pytestmark = [pytest.mark.engine, pytest.mark.scaffolds]


def task(tool: str) -> str:
    return f"Use the {tool} tool to run: {COMMAND}"


@dataclass
class ClientRun:
    """One headless run of a scaffold: how it ended and what it printed."""

    name: str
    argv: list[str]
    exit_code: int | None  # None: killed after CLIENT_TIMEOUT_S
    stdout: str
    stderr: str
    seconds: float

    def describe(self, tail: int = 3000) -> str:
        ended = "timed out" if self.exit_code is None else f"exit code {self.exit_code}"
        return (
            f"{self.name}: {ended} after {self.seconds:.1f}s\n"
            f"argv: {self.argv}\n"
            f"--- stdout (tail) ---\n{self.stdout[-tail:]}\n"
            f"--- stderr (tail) ---\n{self.stderr[-tail:]}"
        )


@dataclass
class Ingress:
    url: str
    proc: ManagedProcess
    settings: Settings
    tokenizer: Any

    async def open(self, client: str) -> tuple[str, str]:
        """A new session for ``client`` and the API key its scaffold must send: the driver's
        open call gives it where session keys are on; anything passes otherwise."""
        session = f"{client}-{uuid.uuid4().hex[:8]}"
        if not self.settings.driver_token:
            return session, "titoflow-unused"
        async with RolloutClient(self.url, self.settings) as driver:
            opened = await driver.open(session_id=session)
        return session, opened.api_key


def client_binary(name: str) -> Path:
    path = TOOLS_BIN / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run `bash scripts/setup-scaffolds.sh` first")
    return path


def isolated_env(root: Path, extra: dict[str, str]) -> dict[str, str]:
    """A minimal environment: nothing from the caller's (no API keys, proxies or configs)."""
    home = root / "home"
    dirs = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_STATE_HOME": home / ".local" / "state",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    node = shutil.which("node")
    path_dirs = [str(TOOLS_BIN)]
    if node:
        path_dirs.append(str(Path(node).parent))
    path_dirs += ["/usr/local/bin", "/usr/bin", "/bin"]
    return {
        **{key: str(value) for key, value in dirs.items()},
        "PATH": os.pathsep.join(path_dirs),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "npm_config_registry": DEAD_REGISTRY,
        **extra,
    }


def run_client(name: str, argv: list[str], env: dict[str, str], cwd: Path) -> ClientRun:
    """Runs the client in its own process group; kills the whole group on timeout and after
    exit (clients leave background helpers behind)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=CLIENT_TIMEOUT_S)
        exit_code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        exit_code = None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return ClientRun(
        name,
        argv,
        exit_code,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        time.monotonic() - started,
    )


@pytest.fixture
def ingress(
    agent_stack_settings: Settings, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Ingress]:
    """A real ingress and worker on this test's topics, the agentic policy's engine (behind the
    witness) and the session broker; with ``indirect`` param True, configured as compose runs
    it: a driver token and no implicit sessions (a scaffold needs its session's key)."""
    update: dict[str, Any] = {"default_max_tokens": MAX_OUTPUT_TOKENS}
    if getattr(request, "param", False):
        update |= {"driver_token": f"driver-{uuid.uuid4().hex}", "implicit_sessions": False}
    settings = agent_stack_settings.model_copy(update=update)
    proc, url = start_ingress(settings, tmp_path / "logs")
    worker = start_worker(settings, tmp_path / "logs")
    try:
        yield Ingress(url, proc, settings, load_tokenizer(settings.model_path))
    finally:
        proc.stop()
        worker.stop()


@dataclass
class Trajectory:
    steps: list[StepRecorded]
    segments: list[SegmentFinalized]


async def trajectory(ingress: Ingress, session: str) -> Trajectory:
    """The session's steps, then (the driver's finalize) its segments."""
    events = await read_all(ingress.settings, ingress.settings.topic("steps"), steps_topic_adapter)
    steps = [e for e in events if isinstance(e, StepRecorded) and e.session_id == session]
    segments = await finalized_segments(ingress.settings, ingress.url, session) if steps else []
    return Trajectory(steps, segments)


def assert_tool_loop(
    run: ClientRun, work: Path, got: Trajectory, api: str, ingress: Ingress, ended: bool
) -> None:
    """The run ended well, the tool ran, and the steps hold a call and the answer after it."""
    decode = ingress.tokenizer.decode
    calls = [(s.api, s.stream, s.finish_reason, decode(s.completion_ids)[:120]) for s in got.steps]
    divergences = Counter({k: v for s in got.segments for k, v in s.diagnostics.items() if v})
    report = (
        f"{run.describe(tail=1500)}\n--- model calls (api, stream, finish, completion) ---\n"
        + "\n".join(map(str, calls))
        + f"\n--- {len(got.segments)} segment(s): split reasons "
        f"{[s.split_reason for s in got.segments]}, tokens "
        f"{[len(s.token_ids) for s in got.segments]}, diagnostics {dict(divergences)}"
    )
    print(report)  # shown with `pytest -rP`: what each scaffold did, for docs/scaffolds.md
    context = f"{report}\n--- ingress log (tail) ---\n{ingress.proc.log_tail()}"
    assert run.exit_code == 0, f"the client failed\n{context}"
    assert ended, f"the client did not report a completed run\n{context}"
    assert (work / MARKER).exists(), f"the command never ran\n{context}"
    ours = [s for s in got.steps if s.api == api]
    assert len(ours) >= 2, f"no tool round trip through titoflow\n{context}"
    [call] = [s for s in ours if "<tool_call>" in decode(s.completion_ids)]
    answer = ours[ours.index(call) + 1]
    # One segment holds the round trip: the scaffold did not rewrite the history between.
    [holder] = [g for g in got.segments if call.step_id in {s.step_id for s in g.steps}]
    assert answer.step_id in {s.step_id for s in holder.steps}, f"round trip split\n{context}"


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among a client's output lines (others are skipped)."""
    objects = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(line)
            if isinstance(value, dict):
                objects.append(value)
    return objects


def new_session(client: str) -> str:
    return f"{client}-{uuid.uuid4().hex[:8]}"


def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello\n")
    return work


@pytest.mark.parametrize("mode", ["default", "bare"])
async def test_claude_code(ingress: Ingress, tmp_path: Path, mode: str) -> None:
    session = new_session(f"claude-{mode}")
    work = workdir(tmp_path)
    env = isolated_env(
        tmp_path,
        {
            # No /v1: Claude Code appends /v1/messages itself.
            "ANTHROPIC_BASE_URL": f"{ingress.url}/sess/{session}",
            "ANTHROPIC_API_KEY": "titoflow-unused",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT_TOKENS),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
        },
    )
    argv = [
        str(client_binary("claude")),
        "-p",
        task("Bash"),
        *(["--bare"] if mode == "bare" else []),
        "--allowedTools",
        "Bash",
        "--model",
        ingress.settings.served_model_name,
        "--output-format",
        "json",
    ]
    run = await asyncio.to_thread(run_client, f"claude ({mode})", argv, env, work)
    result: dict[str, Any] = {}
    with contextlib.suppress(json.JSONDecodeError):
        result = json.loads(run.stdout)
    ended = (
        result.get("type") == "result"
        and result.get("is_error") is False
        and result.get("api_error_status") is None
        and int(result.get("num_turns") or 0) >= 2
    )
    got = await trajectory(ingress, session)
    assert_tool_loop(run, work, got, "anthropic.messages", ingress, ended)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_opencode(ingress: Ingress, tmp_path: Path, provider: str) -> None:
    await opencode_loop(ingress, tmp_path, provider)


@pytest.mark.parametrize("ingress", [True], indirect=True, ids=["session-keys"])
async def test_opencode_as_compose_runs_it(ingress: Ingress, tmp_path: Path) -> None:
    """Session keys on: OpenCode's own x-session-id header (its internal id) names no session
    on a /sess/<id>/ URL, so the loop runs with the session's key as its API key."""
    await opencode_loop(ingress, tmp_path, "openai")


async def opencode_loop(ingress: Ingress, tmp_path: Path, provider: str) -> None:
    session, api_key = await ingress.open(f"opencode-{provider}")
    work = workdir(tmp_path)
    model = ingress.settings.served_model_name
    npm = "@ai-sdk/openai-compatible" if provider == "openai" else "@ai-sdk/anthropic"
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"bash": "allow"},
        "model": f"titoflow/{model}",
        "provider": {
            "titoflow": {
                "npm": npm,
                "name": "titoflow",
                # Both providers take the base URL with /v1 and append their route.
                "options": {"baseURL": "{env:TITOFLOW_BASE_URL}", "apiKey": api_key},
                "models": {
                    model: {
                        "name": "titoflow policy",
                        "limit": {
                            "context": ingress.settings.engine_max_model_len,
                            "output": MAX_OUTPUT_TOKENS,
                        },
                    }
                },
            }
        },
    }
    (work / "opencode.json").write_text(json.dumps(config, indent=2))
    env = isolated_env(
        tmp_path,
        {
            "TITOFLOW_BASE_URL": f"{ingress.url}/sess/{session}/v1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        },
    )
    argv = [str(client_binary("opencode")), "run", "--format", "json", task("bash")]
    run = await asyncio.to_thread(run_client, f"opencode ({provider})", argv, env, work)
    events = json_lines(run.stdout)
    ended = bool(events) and not [e for e in events if e.get("type") == "error"]
    got = await trajectory(ingress, session)
    api = "openai.chat" if provider == "openai" else "anthropic.messages"
    assert_tool_loop(run, work, got, api, ingress, ended)


async def test_codex(ingress: Ingress, tmp_path: Path) -> None:
    session = new_session("codex")
    work = workdir(tmp_path)
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        f"""\
model = "{ingress.settings.served_model_name}"
model_provider = "titoflow"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.titoflow]
name = "titoflow"
base_url = "{ingress.url}/sess/{session}/v1"
wire_api = "responses"
env_key = "TITOFLOW_API_KEY"
request_max_retries = 1
stream_max_retries = 1

[analytics]
enabled = false

[feedback]
enabled = false
"""
    )
    env = isolated_env(
        tmp_path, {"CODEX_HOME": str(codex_home), "TITOFLOW_API_KEY": "titoflow-unused"}
    )
    argv = [
        str(client_binary("codex")),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--disable",
        "plugins",
        "--disable",
        "apps",
        "--disable",
        "remote_plugin",
        task("exec_command"),
    ]
    run = await asyncio.to_thread(run_client, "codex", argv, env, work)
    events = json_lines(run.stdout)
    failed = [e for e in events if e.get("type") in ("error", "turn.failed")]
    ended = any(e.get("type") == "turn.completed" for e in events) and not failed
    got = await trajectory(ingress, session)
    assert_tool_loop(run, work, got, "openai.responses", ingress, ended)


async def test_openai_agents(ingress: Ingress, tmp_path: Path) -> None:
    """openai-agents' Runner: a Python agent loop with a function tool, over chat completions."""
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    session = new_session("agents")
    work = workdir(tmp_path)

    @function_tool
    def bash(command: str) -> str:
        """Run a shell command in the work directory and return its output."""
        done = subprocess.run(
            command, shell=True, cwd=work, capture_output=True, text=True, timeout=30
        )
        return done.stdout + done.stderr

    client = AsyncOpenAI(base_url=f"{ingress.url}/sess/{session}/v1", api_key="unused")
    agent = Agent(
        name="shell",
        instructions="You run shell commands with the bash tool.",
        tools=[bash],
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
    )
    started = time.monotonic()
    result = await Runner.run(agent, task("bash"), max_turns=4)
    await client.close()
    run = ClientRun(
        "openai-agents", ["Runner.run"], 0, str(result.final_output), "", time.monotonic() - started
    )
    got = await trajectory(ingress, session)
    assert_tool_loop(run, work, got, "openai.chat", ingress, bool(result.final_output))

"""Opt-in: real, unmodified agent scaffolds run headless against a real ingress.

Claude Code, OpenCode and Codex (pinned versions installed by ``scripts/setup-scaffolds.sh``
into ``.tools/npm``) each get a fresh titoflow session as their base URL and one task, and run
to completion on their own. The policy is the tiny random-weight model, so the answer is
gibberish and no tool is ever called: what is tested is that each client's own requests
(streaming, its headers, tools, beta flags) go through the ingress and that every model call
becomes a ``StepRecorded`` on the steps topic with the right ``api`` and ``stream``.

What "ran" means per client (exit code and output are in every assertion message). The model
never emits its end-of-turn token, so every completion stops at the token budget
(``finish_reason: length``); clients that treat that as a failed turn exit 1, which is accepted
only when that is the sole failure and the calls were recorded:

* Claude Code (``--output-format json``): a ``result`` object with ``api_error_status`` null, and
  either success (exit 0, ``is_error`` false) or the output-limit error (exit 1, result "...
  exceeded the N output token maximum", after it retried the turn 3 times with "continue"). An
  HTTP error from the ingress shows up as ``api_error_status`` and fails the test.
* OpenCode (``--format json``): exit 0 and no ``"type":"error"`` event (it accepts a turn cut at
  the limit as a normal end).
* Codex (``exec --json``): ``turn.started``, then either success (exit 0, no ``turn.failed``) or
  exit 1 whose only failure is "Incomplete response returned, reason: max_output_tokens".

Each client is kept offline: its own home/config directories, the documented switches that turn
off telemetry, update checks, plugin and model-list downloads, and an npm registry pointed at a
closed loopback port (OpenCode otherwise installs ``@opencode-ai/plugin`` from the registry in
the background). See docs/scaffolds.md for the same setup by hand.

Enable with ``TITOFLOW_SCAFFOLD_TESTS=1`` after ``bash scripts/setup-scaffolds.sh``.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schemas.events import StepRecorded, steps_topic_adapter
from tests.topics import read_until
from titoflow.procs import ManagedProcess
from titoflow.settings import PROJECT_ROOT, Settings
from titoflow.stack import start_ingress, start_worker

ENABLE_ENV = "TITOFLOW_SCAFFOLD_TESTS"
TOOLS_BIN = PROJECT_ROOT / ".tools" / "npm" / "bin"
CLIENT_TIMEOUT_S = 180.0
TASK = "List the files in the current directory, then say what the largest one is."
# A closed port on loopback: any registry download a client attempts fails at once, offline.
DEAD_REGISTRY = "http://127.0.0.1:9/"
# Completion budget per call. The ingress clamps a client's max_tokens only to the context
# window, and the random-weight model rarely stops on its own: Claude Code asks for 32000
# tokens (unknown model), Codex for none (the ingress default applies).
MAX_OUTPUT_TOKENS = 48

pytestmark = [
    pytest.mark.engine,
    pytest.mark.scaffolds,
    pytest.mark.skipif(
        os.environ.get(ENABLE_ENV) != "1",
        reason=f"opt-in: run `bash scripts/setup-scaffolds.sh` (installs the pinned Claude Code, "
        f"OpenCode and Codex into .tools/npm), then set {ENABLE_ENV}=1",
    ),
]


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
def ingress(stack_settings: Settings, tmp_path: Path) -> Iterator[Ingress]:
    """A real ingress and worker on this test's topics, the session engine and broker."""
    settings = stack_settings.model_copy(update={"default_max_tokens": MAX_OUTPUT_TOKENS})
    proc, url = start_ingress(settings, tmp_path / "logs")
    worker = start_worker(settings, tmp_path / "logs")
    try:
        yield Ingress(url, proc, settings)
    finally:
        proc.stop()
        worker.stop()


async def recorded_steps(settings: Settings, session: str) -> list[StepRecorded]:
    """The session's steps on the steps topic (the client has exited, so all are there)."""

    def mine(events: list[Any]) -> list[StepRecorded]:
        return [e for e in events if isinstance(e, StepRecorded) and e.session_id == session]

    try:
        events = await read_until(
            settings,
            settings.topic("steps"),
            steps_topic_adapter,
            lambda got: bool(mine(got)),
            timeout_s=30,
        )
    except TimeoutError:
        return []
    return mine(events)


def assert_recorded(
    run: ClientRun, steps: list[StepRecorded], api: str, ingress: Ingress, ran: bool
) -> None:
    summary = [(s.api, s.stream, s.finish_reason, len(s.completion_ids)) for s in steps]
    context = (
        f"{run.describe()}\n--- steps (api, stream, finish, completion tokens) ---\n{summary}\n"
        f"--- ingress log (tail) ---\n{ingress.proc.log_tail()}"
    )
    # Shown with `pytest -rP`: what each client did, for docs/scaffolds.md.
    print(f"{run.describe(tail=600)}\nsteps (api, stream, finish, completion tokens): {summary}")
    assert run.exit_code is not None, f"the client did not finish\n{context}"
    assert steps, f"no StepRecorded for the session\n{context}"
    assert all(s.api == api for s in steps), context
    assert all(s.stream for s in steps), context
    assert ran, f"the client did not complete its run\n{context}"


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


async def test_claude_code(ingress: Ingress, tmp_path: Path) -> None:
    session = new_session("claude")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello\n")
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
        TASK,
        "--bare",
        "--allowedTools",
        "Bash",
        "--model",
        ingress.settings.served_model_name,
        "--output-format",
        "json",
    ]
    run = await asyncio.to_thread(run_client, "claude", argv, env, work)
    steps = await recorded_steps(ingress.settings, session)
    result: dict[str, Any] = {}
    with contextlib.suppress(json.JSONDecodeError):
        result = json.loads(run.stdout)
    if result.get("is_error"):  # only the gibberish model's fault: it never stops on its own
        ran = run.exit_code == 1 and "output token maximum" in str(result.get("result"))
    else:
        ran = run.exit_code == 0
    ran = ran and result.get("type") == "result" and result.get("api_error_status") is None
    assert_recorded(run, steps, "anthropic.messages", ingress, ran)


async def test_opencode(ingress: Ingress, tmp_path: Path) -> None:
    session = new_session("opencode")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello\n")
    model = ingress.settings.served_model_name
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"bash": "allow"},
        "model": f"titoflow/{model}",
        "provider": {
            "titoflow": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "titoflow",
                "options": {"baseURL": "{env:TITOFLOW_BASE_URL}", "apiKey": "titoflow-unused"},
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
    argv = [str(client_binary("opencode")), "run", "--format", "json", TASK]
    run = await asyncio.to_thread(run_client, "opencode", argv, env, work)
    steps = await recorded_steps(ingress.settings, session)
    events = json_lines(run.stdout)
    errors = [e for e in events if e.get("type") == "error"]
    ran = run.exit_code == 0 and bool(events) and not errors
    assert_recorded(run, steps, "openai.chat", ingress, ran)


async def test_codex(ingress: Ingress, tmp_path: Path) -> None:
    session = new_session("codex")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello\n")
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
        TASK,
    ]
    run = await asyncio.to_thread(run_client, "codex", argv, env, work)
    steps = await recorded_steps(ingress.settings, session)
    events = json_lines(run.stdout)
    failures = [str(e.get("error") or e.get("message")) for e in events if e.get("type") == "error"]
    failures += [str(e.get("error")) for e in events if e.get("type") == "turn.failed"]
    if failures:  # only the gibberish model's fault: it never stops on its own
        ran = run.exit_code == 1 and all("max_output_tokens" in f for f in failures)
    else:
        ran = run.exit_code == 0
    ran = ran and any(e.get("type") == "turn.started" for e in events)
    assert_recorded(run, steps, "openai.responses", ingress, ran)

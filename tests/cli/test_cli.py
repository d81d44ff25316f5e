"""The command line as people meet it: a setting no command can work with is one line naming it
and the fix (exit status 2, no traceback), libraries' log lines stay out of the terminal, and
``titoflow <command> --help`` offers exactly the settings that command reads, with readable
placeholders."""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.dev.procs import free_port
from cli.main import main
from titoflow.image_store import ImageStore
from titoflow.settings import COMMANDS, EVERYDAY, PROJECT_ROOT, SECTION, SECTIONS, Settings

HAND_RUN = (
    "up",
    "ingress",
    "worker",
    "recompute",
    "replay",
    "inspect",
    "export",
    "control",
    "images",
)
SERVICES = ("ingress", "worker", "recompute")


def titoflow(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``titoflow ARGS`` in a fresh process, with only ``env`` of the TITOFLOW_* variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TITOFLOW_")}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        env={**clean, "PYTHONPATH": str(PROJECT_ROOT), **env},
        timeout=120,
    )


def one_line(result: subprocess.CompletedProcess[str], command: str, status: int = 2) -> str:
    assert result.returncode == status, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"titoflow {command}: "), result.stderr
    return lines[0]


def test_every_setting_names_the_commands_that_read_it() -> None:
    assert set(COMMANDS) == set(SECTION) == set(Settings.model_fields)  # each in a section
    for name, commands in COMMANDS.items():
        assert commands and set(commands) <= set(HAND_RUN), name
        if set(commands) & set(SERVICES):  # `up` passes it to the service it starts
            assert "up" in commands, name


HELP_ARGV = [
    ["up"],
    ["ingress"],
    ["worker"],
    ["recompute"],
    ["replay"],
    ["inspect"],
    ["export"],
    ["control", "pause"],
    ["control", "resume"],
    ["control", "set-version", "v1"],
    ["control", "engine-add", "http://e"],
    ["control", "engine-drain", "http://e"],
    ["control", "engine-remove", "http://e"],
    ["images", "prune"],
]


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str], shown: str = "--help") -> str:
    """What ``titoflow ARGV --help`` (or ``shown``) prints, on an 80-column terminal."""
    with pytest.raises(SystemExit) as done:
        main([*argv, shown])
    assert done.value.code == 0
    return capsys.readouterr().out


def offered(shown: str) -> dict[str, str]:
    """The settings' flags in help text ``shown``, with the placeholder of each."""
    return dict(re.findall(r"^  --([a-z0-9-]+) (<\S+)", shown, re.MULTILINE))


@pytest.mark.parametrize("argv", HELP_ARGV)
def test_help_fits_a_screen_and_its_sections_offer_the_settings_its_command_reads(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain --help is at most 40 lines (its everyday settings); --help=SECTION shows that
    section's settings the command reads, and the sections together show all of them."""
    monkeypatch.setenv("COLUMNS", "80")
    shown = help_of(argv, capsys)
    assert len(shown.splitlines()) <= 40, shown
    expected = {name for name, commands in COMMANDS.items() if argv[0] in commands}
    assert set(offered(shown)) == {n.replace("_", "-") for n in expected & EVERYDAY}
    sections = {SECTION[name] for name in expected}
    assert re.findall(r"\b([a-z]+) \(\d+\)", shown) == [s for s in SECTIONS if s in sections]
    seen: set[str] = set()
    for section in sections:
        listed = help_of(argv, capsys, f"--help={section}")
        flags = offered(listed)
        assert set(flags) == {n.replace("_", "-") for n in expected if SECTION[n] == section}
        for flag, value in flags.items():  # <port>, <true|false>, <clamp|refuse>...
            assert re.fullmatch(r"<[^<>\s]+>", value), (flag, value)
        assert "typing." not in listed and "Literal[" not in listed
        assert str(PROJECT_ROOT) not in listed
        seen |= set(flags)
    assert seen == {name.replace("_", "-") for name in expected}


@pytest.mark.parametrize("argv", [[], ["control"], ["images"], ["docs"], ["build-model"]])
def test_the_help_of_what_takes_no_settings_fits_a_screen(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert len(help_of(argv, capsys).splitlines()) <= 40


def test_an_unknown_help_section_is_one_line_naming_the_sections(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["recompute", "--help=nope"])
    assert done.value.code == 2
    out, err = capsys.readouterr()
    read = {SECTION[name] for name, commands in COMMANDS.items() if "recompute" in commands}
    assert "model" not in read and "ingress" not in read
    named = ", ".join(section for section in SECTIONS if section in read)
    assert not out and err == f"titoflow recompute: no section 'nope'; its sections: {named}\n"


def test_each_command_reads_only_its_own() -> None:
    """Spot checks of the table against what the code reads."""
    assert "worker" not in COMMANDS["ingress_port"] and "ingress" not in COMMANDS["worker_group"]
    assert COMMANDS["engine_python"] == ("up",)
    assert "control" in COMMANDS["steps_partitions"]  # it creates the topics
    assert "inspect" not in COMMANDS["steps_partitions"]
    assert "images" in COMMANDS["image_store_dir"] and "images" in COMMANDS["segments_retention_s"]


BAD_SETTINGS = [
    # (command, variables, the setting the line must name, a part of its fix)
    ("ingress", {"TITOFLOW_INGRESS_PORT": "99999"}, "TITOFLOW_INGRESS_PORT: ", "65535"),
    ("ingress", {"TITOFLOW_ENGINE_URLS": "tgi=http://x"}, "TITOFLOW_ENGINE_URLS", "vllm, sglang"),
    ("ingress", {"TITOFLOW_ENGINE_URL": "localhost:8000"}, "TITOFLOW_ENGINE_URL", "http://"),
    ("ingress", {"TITOFLOW_MODEL_PATH": "/nonexistent"}, "TITOFLOW_MODEL_PATH", "build-model"),
    ("ingress", {"TITOFLOW_INGRESS_HOST": "nowhere.invalid"}, "TITOFLOW_INGRESS_HOST", "free port"),
    ("ingress", {"TITOFLOW_IMPLICIT_SESSIONS": "false"}, "TITOFLOW_DRIVER_TOKEN", "set"),
    ("worker", {"TITOFLOW_BUILD_MODE": "last"}, "TITOFLOW_BUILD_MODE: ", "'concat'"),
    ("worker", {"TITOFLOW_MODEL_FAMILY": "gpt5"}, "TITOFLOW_MODEL_FAMILY: ", "qwen3"),
    ("worker", {"TITOFLOW_BOOTSTRAP_SERVERS": ""}, "TITOFLOW_BOOTSTRAP_SERVERS", "host:port"),
    ("recompute", {"TITOFLOW_ENGINE_URL": ""}, "TITOFLOW_ENGINE_URL", "base URL"),
    ("replay", {"TITOFLOW_STEPS_PARTITIONS": "eight"}, "TITOFLOW_STEPS_PARTITIONS", "integer"),
    ("inspect", {"TITOFLOW_BOOTSTRAP_SERVERS": ""}, "TITOFLOW_BOOTSTRAP_SERVERS", "host:port"),
    ("export", {"TITOFLOW_BOOTSTRAP_SERVERS": ""}, "TITOFLOW_BOOTSTRAP_SERVERS", "host:port"),
    ("control", {"TITOFLOW_LOG_FORMAT": "xml"}, "TITOFLOW_LOG_FORMAT: ", "'json'"),
    ("worker", {"TITOFLOW_STEPS_RETENTION_S": "0"}, "TITOFLOW_STEPS_RETENTION_S", "-1 to keep"),
    ("build-model", {"TITOFLOW_LOG_LEVEL": "LOUD"}, "TITOFLOW_LOG_LEVEL: ", "'DEBUG'"),
    (
        "up",
        {"TITOFLOW_DRIVER_PORT": "7", "TITOFLOW_INGRESS_PORT": "7"},
        "TITOFLOW_DRIVER_PORT",
        "own",
    ),
    ("up", {"TITOFLOW_ENGINE_URLS": "tgi=http://x"}, "TITOFLOW_ENGINE_URLS", "vllm, sglang"),
    ("up", {"TITOFLOW_DRIVER_HOST": "nowhere.invalid"}, "TITOFLOW_DRIVER_HOST", "address"),
]
EXTRA_ARGS = {
    "replay": ["--out", "/dev/null"],
    "inspect": ["--session", "s"],
    "control": ["resume"],
}


@pytest.mark.parametrize(("command", "env", "named", "fix"), BAD_SETTINGS)
def test_a_bad_setting_is_one_line_naming_it(
    command: str,
    env: dict[str, str],
    named: str,
    fix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In this process (a traceback would be this test's error); every other setting a command
    checks is good, and the unreachable broker and engine are never called: the bad setting
    stops the command first."""
    for name in [name for name in os.environ if name.startswith("TITOFLOW_")]:
        monkeypatch.delenv(name)
    good = {
        "TITOFLOW_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port('127.0.0.1')}",
        "TITOFLOW_ENGINE_URL": "http://127.0.0.1:1",
    }
    for name, value in {**good, **env}.items():
        monkeypatch.setenv(name, value)
    args = [command, *EXTRA_ARGS.get(command, [])]
    if command == "up":
        args += ["--run-dir", str(tmp_path)]
    assert main(args) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"titoflow {command}: "), lines
    assert named in lines[0] and fix in lines[0], lines[0]


def test_a_tokenizer_that_is_code_is_refused_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory whose tokenizer is its own code (Kimi's ships so) stops a service in one line
    naming TITOFLOW_TRUST_REMOTE_CODE, the opt-in vLLM's --trust-remote-code mirrors."""
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}})
    )
    for name in [name for name in os.environ if name.startswith("TITOFLOW_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TITOFLOW_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port('127.0.0.1')}")
    monkeypatch.setenv("TITOFLOW_MODEL_PATH", str(tmp_path))
    assert main(["worker"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("titoflow worker: TITOFLOW_TRUST_REMOTE_CODE: "), line
    assert "TITOFLOW_TRUST_REMOTE_CODE=1" in line


def test_an_unreachable_broker_is_one_line_without_library_logs() -> None:
    """aiokafka's own error lines about the connection stay out of the terminal."""
    broker = f"127.0.0.1:{free_port('127.0.0.1')}"
    line = one_line(titoflow("control", "resume", TITOFLOW_BOOTSTRAP_SERVERS=broker), "control", 1)
    assert broker in line, line
    asked = titoflow("control", "resume", "--log-level", "ERROR", TITOFLOW_BOOTSTRAP_SERVERS=broker)
    assert '"logger": "aiokafka"' in asked.stderr  # shown when a log level is asked for


def test_up_makes_its_driver_token_before_checking_the_settings(tmp_path: Path) -> None:
    """Compose's posture (no implicit sessions) needs a driver token, which `up` makes: the run
    goes on to the model, refused here since the directory is not one (a cheap stop)."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine\n")
    run_dir = tmp_path / "run"
    result = titoflow(
        "up",
        "--run-dir",
        str(run_dir),
        TITOFLOW_IMPLICIT_SESSIONS="false",
        TITOFLOW_MODEL_PATH=str(notes),
    )
    line = one_line(result, "up")
    assert line.startswith(f"titoflow up: TITOFLOW_MODEL_PATH: {notes} holds no model"), line
    token = run_dir / "driver-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text().strip()) > 30
    assert (notes / "todo.txt").read_text() == "mine\n" and len(list(notes.iterdir())) == 1


def test_quiet_libraries_keep_titoflows_own_lines() -> None:
    """The logging of a hand-run command at its default level: titoflow's INFO lines shown,
    none of a library's, not even an error (the command says its failures itself)."""
    code = (
        "import logging; from titoflow.logs import setup_logging; from cli.flags import "
        "QUIET_LIBRARIES; setup_logging('INFO', 'json', QUIET_LIBRARIES); "
        "logging.getLogger('titoflow.up').info('ours'); logging.getLogger('httpx').info('x'); "
        "logging.getLogger('aiokafka').error('y')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        timeout=60,
    )
    [line] = result.stderr.splitlines()
    assert '"logger": "titoflow.up"' in line and '"message": "ours"' in line


def test_up_says_in_one_line_which_child_did_not_start_and_why(tmp_path: Path) -> None:
    """A child that exits while the stack starts (here the ingress, its port taken) stops `up`
    with one line naming it, the last line of its log and where the logs are."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = titoflow(
            "up",
            "--run-dir",
            str(tmp_path),
            TITOFLOW_ENGINE_URL="http://127.0.0.1:1",
            TITOFLOW_INGRESS_PORT=str(port),
        )
    line = one_line(result, "up", 1)
    assert line.startswith("titoflow up: ingress exited with 2"), line
    assert str(port) in line and str(tmp_path / "logs") in line, line


def test_images_prune_dry_run_deletes_nothing_then_prune_says_what_it_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three images: two no step named for ten days, one named now (their mtimes)."""
    store = ImageStore(tmp_path)
    old = [store.put(f"old {n}".encode()) for n in range(2)]
    young = store.put(b"young")
    for sha in old:
        os.utime(store.path(sha), (time.time() - 10 * 86400,) * 2)
    argv = ["images", "prune", "--image-store-dir", str(tmp_path), "--older-than", "8d"]
    week = ["--segments-retention-s", str(7 * 86400)]
    assert main([*argv, *week, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("would remove 2 images (10 bytes) no step named since ") and not err
    assert out.rstrip().endswith("; kept 1 (5 bytes)") and all(store.has(sha) for sha in old)
    assert main([*argv, *week]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("removed 2 images (10 bytes) ") and not err
    assert not any(store.has(sha) for sha in old) and store.get(young) == b"young"
    # An age below the segments' retention is done, with a warning: a trainer may be behind.
    assert main([*argv[:-1], "1d"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("removed 0 images") and err.startswith("warning: --older-than 1d")


@pytest.mark.parametrize("age", ["7x", "0d", "seven", "inf", "=-1d", "nand"])
def test_images_prune_a_bad_age_is_one_line_naming_it(
    age: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ImageStore(tmp_path)
    sha = store.put(b"kept")
    os.utime(store.path(sha), (0, 0))
    flag = f"--older-than{age}" if age.startswith("=") else f"--older-than {age}"
    assert main(["images", "prune", "--image-store-dir", str(tmp_path), *flag.split(" ")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("titoflow images: --older-than ") and "e.g. 8d" in line, line
    assert store.has(sha)


def test_images_prune_of_no_store_or_a_busy_one_is_one_line(tmp_path: Path) -> None:
    missing = titoflow("images", "prune", "--older-than", "8d", "--image-store-dir", "/nonexistent")
    line = one_line(missing, "images")
    assert "TITOFLOW_IMAGE_STORE_DIR" in line and "/nonexistent" in line, line
    held = os.open(tmp_path / ".prune.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = titoflow("images", "prune", "--older-than", "8d", "--image-store-dir", str(tmp_path))
    finally:
        os.close(held)
    assert "another prune holds" in one_line(busy, "images", 1)

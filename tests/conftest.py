"""Shared fixtures: a real broker (tests/support/kafka_fixtures.py) and a real vLLM CPU engine
serving
the tiny deterministic model, each started once per test session; and, per end-to-end test, the
engine-side witness (tests/support/witness.py): a recording proxy in front of the engine, and after
the test the check that every segment on its topic holds exactly what the engine sampled."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import hypothesis
import pytest

from cli.dev.model_build import RANDOM_MODEL_DIR, build_tiny_model
from cli.dev.models import build_agent_policy
from cli.dev.vl_policy import build_vl_policy
from tests.support.engines import SMALL_KV_CACHE_BYTES, engine_for_tests
from tests.support.stacks import CALL_FAILED, witnessed
from tests.support.witness import Witness
from titoflow.settings import Settings

pytest_plugins = ["tests.support.kafka_fixtures"]

# CI draws the same examples every run (a red CI is a finding, not luck); locally they vary.
# No deadline: an example's time is the machine's load (the suite runs in two halves at once),
# and speed is the bench scripts' to measure.
hypothesis.settings.register_profile("ci", derandomize=True, deadline=None)
hypothesis.settings.register_profile("local", deadline=None)
hypothesis.settings.load_profile("ci" if os.environ.get("CI") else "local")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The random-weight model: it never stops early, which the pipeline tests rely on."""
    return build_tiny_model(RANDOM_MODEL_DIR)


@pytest.fixture(scope="session")
def engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_dir = tmp_path_factory.mktemp("vllm")
    yield from engine_for_tests(
        "TITOFLOW_TEST_ENGINE_URL", model_dir, log_dir, kv_cache_bytes=SMALL_KV_CACHE_BYTES
    )


@pytest.fixture(scope="session")
def agent_model_dir() -> Path:
    """The tiny agentic policy (the local default): it calls tools and ends its turns."""
    return build_agent_policy(Settings().model_path)


@pytest.fixture(scope="session")
def agent_engine_url(
    agent_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    log_dir = tmp_path_factory.mktemp("vllm-agent")
    yield from engine_for_tests("TITOFLOW_TEST_AGENT_ENGINE_URL", agent_model_dir, log_dir)


@pytest.fixture(scope="session")
def vl_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny vision-language policy (cli/dev/vl_policy.py), built for this session."""
    return build_vl_policy(tmp_path_factory.mktemp("vl") / "tiny-qwen3-vl")


@pytest.fixture(scope="module")
def vl_engine_url(vl_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM CPU serving it, for one module: held for the whole session it would sit beside the
    shared engines and the two-engine tests' second one (~6 GB more, near CI's 24 GiB)."""
    log_dir = tmp_path_factory.mktemp("vllm-vl")
    yield from engine_for_tests(
        "TITOFLOW_TEST_VL_ENGINE_URL", vl_model_dir, log_dir, kv_cache_bytes=SMALL_KV_CACHE_BYTES
    )


# A test on any of these runs a vLLM engine: it must say so (``pytest.mark.engine``), for
# scripts/test.sh runs the engine tests and the rest as two halves at once.
ENGINE_FIXTURES = {
    "engine_url",
    "agent_engine_url",
    "vl_engine_url",
    "second_engine_url",
    "family_engines",
}


# The CLI's and the end-to-end tests start, kill and stop whole services and time what they
# do: scripts/test.sh runs them with the engine tests (``processes``), not in the niced half.
PROCESS_TESTS = (Path(__file__).parent / "cli", Path(__file__).parent / "e2e")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.path.is_relative_to(tests) for tests in PROCESS_TESTS):
            item.add_marker(pytest.mark.processes)
    unmarked = [
        item.nodeid
        for item in items
        if isinstance(item, pytest.Function)
        and ENGINE_FIXTURES & set(item.fixturenames)
        and item.get_closest_marker("engine") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            f"{unmarked[0]} (and {len(unmarked) - 1} more) use a vLLM engine without "
            "pytest.mark.engine: mark them (scripts/test.sh runs the engine tests apart)"
        )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.fixture
def witness() -> Iterator[Witness]:
    """Recording proxies in front of this test's engines (``witness.front(url)``)."""
    recorder = Witness()
    yield recorder
    recorder.stop()


@pytest.fixture
def stack_settings(
    settings: Settings,
    engine_url: str,
    model_dir: Path,
    witness: Witness,
    request: pytest.FixtureRequest,
) -> Iterator[Settings]:
    """This test's topics on the session broker, the session engine behind the witness's
    recording proxy, and a fast idle timeout. Afterwards every segment on the test's topic is
    held to what the engine witnessed (``@pytest.mark.witness_off("why")`` opts out)."""
    yield from witnessed(settings, engine_url, model_dir, witness, request)


@pytest.fixture
def agent_stack_settings(
    settings: Settings,
    agent_engine_url: str,
    agent_model_dir: Path,
    witness: Witness,
    request: pytest.FixtureRequest,
) -> Iterator[Settings]:
    """As ``stack_settings``, with the tiny agentic policy's engine (real tool loops)."""
    yield from witnessed(settings, agent_engine_url, agent_model_dir, witness, request)


@pytest.fixture
def vl_stack_settings(
    settings: Settings,
    vl_engine_url: str,
    vl_model_dir: Path,
    witness: Witness,
    request: pytest.FixtureRequest,
) -> Iterator[Settings]:
    """As ``stack_settings``, with the module's vision-language engine (issue 30)."""
    yield from witnessed(settings, vl_engine_url, vl_model_dir, witness, request)

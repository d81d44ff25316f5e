"""Shared fixtures: a real broker (tests/kafka_fixtures.py) and a real vLLM CPU engine serving
the tiny deterministic model, each started once per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines import engine_for_tests
from titoflow.model_build import build_tiny_model
from titoflow.settings import Settings

pytest_plugins = ["tests.kafka_fixtures"]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return build_tiny_model(Settings().model_path)


@pytest.fixture(scope="session")
def engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_dir = tmp_path_factory.mktemp("vllm")
    yield from engine_for_tests("TITOFLOW_TEST_ENGINE_URL", model_dir, log_dir)


@pytest.fixture
def stack_settings(settings: Settings, engine_url: str, model_dir: Path) -> Settings:
    """This test's topics on the session broker, the session engine, and a fast idle timeout."""
    return settings.model_copy(
        update={"engine_url": engine_url, "model_path": model_dir, "log_level": "DEBUG"}
    )

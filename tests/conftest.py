"""Shared fixtures: a real broker (tests/kafka_fixtures.py) and a real vLLM CPU engine serving
the tiny deterministic model, each started once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from titoflow.engine_process import start_vllm
from titoflow.model_build import build_tiny_model
from titoflow.settings import Settings

pytest_plugins = ["tests.kafka_fixtures"]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return build_tiny_model(Settings().model_path)


@pytest.fixture(scope="session")
def engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Developers sharing one machine may point tests at an engine already serving the same
    # model; CI never sets this, so it always starts its own.
    shared = os.environ.get("TITOFLOW_TEST_ENGINE_URL")
    if shared:
        yield shared
        return
    proc, url = start_vllm(Settings(model_path=model_dir), log_dir=tmp_path_factory.mktemp("vllm"))
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture
def stack_settings(settings: Settings, engine_url: str, model_dir: Path) -> Settings:
    """This test's topics on the session broker, the session engine, and a fast idle timeout."""
    return settings.model_copy(
        update={"engine_url": engine_url, "model_path": model_dir, "log_level": "DEBUG"}
    )

"""Kafka fixtures: a real broker for the whole test session, a fresh topic set per test.

The broker is Apache Kafka in a container when testcontainers is installed and a Docker engine
answers, otherwise the embedded tansu broker. Load with ``pytest_plugins`` from conftest.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import uuid
from collections.abc import Iterator

import pytest

from cli.dev.broker import start_tansu
from titoflow.bus import ensure_topics
from titoflow.settings import Settings


def docker_engine_reachable() -> bool:
    """True only when testcontainers is installed and a Docker engine answers a ping.

    A docker CLI or a stale DOCKER_HOST is not enough, so ask the engine itself.
    """
    if importlib.util.find_spec("testcontainers") is None:
        return False
    docker = importlib.import_module("docker")
    try:
        client = docker.from_env()
        try:
            return bool(client.ping())
        finally:
            client.close()
    # docker-py raises DockerException, requests' ConnectionError or plain OSError depending on
    # how the engine is missing; any of them means "use tansu".
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of a broker that lives for the whole test session."""
    if docker_engine_reachable():
        kafka_module = importlib.import_module("testcontainers.kafka")
        with kafka_module.KafkaContainer() as kafka:
            yield str(kafka.get_bootstrap_server())
        return
    proc, bootstrap = start_tansu(tmp_path_factory.mktemp("tansu"))
    try:
        yield bootstrap
    finally:
        proc.stop()


@pytest.fixture
async def settings(kafka_bootstrap: str) -> Settings:
    """Settings on the session broker with this test's own, already created, topics, and its
    own consumer groups: a group the broker never settles (tansu kept one at a generation whose
    leader, a SIGKILLed worker, never synced) must not stall every later test's workers."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    test_settings = Settings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=prefix,
        worker_group=f"{prefix}-workers",
        recompute_group=f"{prefix}-recompute",
    )
    await ensure_topics(test_settings)
    return test_settings

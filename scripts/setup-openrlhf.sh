#!/usr/bin/env bash
# Create <repo>/.venv-openrlhf: OpenRLHF's own code for tests/trainers/test_trainer_openrlhf.py, which runs
# its experience maker, Actor and PPO training step on CPU. OpenRLHF pins GPU-only packages (ray,
# deepspeed, flash-attn, vllm) it does not need for that, so it goes in --no-deps with a pinned
# minimal set; the test stubs the GPU parts as OpenRLHF's own CPU tests do.
# Idempotent: does nothing when that python already imports what the test uses.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-openrlhf"
py="$venv/bin/python"
pip=("$py" -m pip --quiet --disable-pip-version-check)
check="import openrlhf, torch, transformers, PIL"

if [[ -x "$py" ]] && "$py" -c "$check" >/dev/null 2>&1; then
    echo "openrlhf environment ready: $venv"
    exit 0
fi

# OpenRLHF 0.11.2 ships wheels for CPython 3.11 only.
"${PYTHON:-python3.11}" -m venv "$venv"
# One resolver-free install of a pinned set: the engine's torch (on these machines pip resolves
# it to the local CPU-only wheel) with its own dependencies, OpenRLHF's transformers pin, and what
# importing them and OpenRLHF's models and trainer needs (pillow: its VLM helpers).
"${pip[@]}" install --no-deps \
    "openrlhf==0.11.2" "torch==2.13.0" "filelock==4.3.1" "typing-extensions==4.16.0" \
    "sympy==1.14.0" "mpmath==1.3.0" "networkx==3.6.1" "jinja2==3.1.6" "markupsafe==3.0.4" \
    "fsspec==2026.9.0" "transformers==5.15.0" "huggingface-hub==1.33.0" "tokenizers==0.22.2" \
    "safetensors==0.8.0" "numpy==2.3.5" "pyyaml==6.0.4" "regex==2026.11.19" "tqdm==4.70.1" \
    "packaging==26.4" "httpx==0.28.1" "httpcore==1.0.9" "h11==0.16.0" "anyio==4.16.0" \
    "idna==3.20" "certifi==2026.10.19.post1" "click==8.5.1" "pillow==13.0.0" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
"$py" -c "$check; print('openrlhf environment ready: torch', torch.__version__)"

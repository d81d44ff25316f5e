#!/usr/bin/env bash
# Create <repo>/.venv-openrlhf: OpenRLHF's own code for tests/trainers/test_trainer_openrlhf.py, which runs
# its experience maker, Actor and PPO training step on CPU. OpenRLHF pins GPU-only packages (ray,
# deepspeed, flash-attn, vllm) it does not need for that, so it goes in --no-deps with a pinned
# minimal set; the test stubs the GPU parts as OpenRLHF's own CPU tests do.
# Idempotent: does nothing when that python already imports what the test uses.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/side-venv.sh" .venv-openrlhf
check="import openrlhf, torch, transformers, PIL"
# OpenRLHF 0.11.2 ships wheels for CPython 3.11 only.
ready_or_new openrlhf "$check"
# One resolver-free install of a pinned set: the engine's torch, OpenRLHF's transformers pin
# (5.15), and what importing OpenRLHF's models and trainer needs (pillow: its VLM helpers).
pip_install --no-deps "openrlhf==0.11.2" "${torch_pins[@]}" "${transformers_pins[@]}" "pillow==13.0.0"
"$py" -c "$check; print('openrlhf environment ready: torch', torch.__version__)"

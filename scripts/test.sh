#!/usr/bin/env bash
# One command, fresh machine: install, then lint, type-check, check the generated schemas,
# and run the whole test suite on real parts (tansu broker, vLLM CPU engine).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy .
.venv/bin/titoflow docs --check
exec .venv/bin/python -m pytest "$@"

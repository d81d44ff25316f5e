#!/usr/bin/env bash
# One command, fresh machine: install, then run broker + vLLM CPU + ingress + worker on the
# embedded defaults and drive a short conversation through them. Ctrl-C stops everything.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
exec "$root/.venv/bin/titoflow" up --demo "$@"

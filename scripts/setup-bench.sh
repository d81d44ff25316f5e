#!/usr/bin/env bash
# Installs what the comparative benchmarks need beside the core environment (idempotent): LiteLLM's
# proxy in its own environment (.venv-bench), so its many pinned dependencies never touch .venv.
# 1.105.0 is pinned deliberately: it predates the compromised 1.107.0 release, and newer ones need
# a certifi newer than the package index here has.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
LITELLM_VERSION=1.105.0
if [ ! -x .venv-bench/bin/python ]; then
    python3.11 -m venv .venv-bench
fi
if ! .venv-bench/bin/python -c "import litellm.proxy.proxy_server" 2>/dev/null \
    || [ "$(.venv-bench/bin/python -c 'import importlib.metadata as m; print(m.version("litellm"))')" != "$LITELLM_VERSION" ]; then
    .venv-bench/bin/python -m pip install --quiet --disable-pip-version-check \
        "litellm[proxy]==$LITELLM_VERSION"
fi
LITELLM_LOCAL_MODEL_COST_MAP=True .venv-bench/bin/litellm --version >/dev/null

#!/usr/bin/env bash
# Installs everything titoflow needs on a fresh machine (idempotent): the core environment
# (.venv), the vLLM CPU engine environment (.venv-engine), OpenRLHF's (.venv-openrlhf), verl's
# (.venv-verl), tinker-cookbook's (.venv-tinker), the tiny local models (.models) and the pinned
# agent scaffolds (.tools/npm, with the machine's node/npm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# nginx: the session-hashing load balancer of compose.yaml, exercised by the topology test.
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light
}
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,otel,torch,export,stack]" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import titoflow, aiokafka, transformers, torch" # fails loudly if the install did
bash scripts/setup-engine.sh
bash scripts/setup-openrlhf.sh # OpenRLHF's own code, for its trainer test
bash scripts/setup-verl.sh     # verl's own code, for its trainer test
bash scripts/setup-tinker.sh   # tinker-cookbook's own code, for its trainer test
# SGLang's own request/response definitions (pinned wheel, a few files extracted, never
# installed) for the SGLang backend's contract tests.
.venv/bin/python -m tests.support.sglang_reference
.venv/bin/titoflow build-model >/dev/null          # the agentic policy the local stack serves
.venv/bin/titoflow build-model --random >/dev/null # the random-weight model of the pipeline tests
bash scripts/setup-scaffolds.sh                    # Claude Code, OpenCode, Codex (the scaffold tests)

#!/usr/bin/env bash
# One command, fresh machine: install, then lint, type-check, check the generated schemas,
# and run the whole test suite on real parts (tansu broker, vLLM CPU engine).
#
# With no arguments the suite runs as two halves at once: the tests on vLLM engines and whole
# services (`-m "engine or processes"`: end to end, trainers, the CLI; mostly waiting on their
# engines and processes, the longer half) and the rest (CPU-bound in one process, niced like
# the engines so that it takes what the first half leaves), each on its own broker; the
# second's report follows the first's. Arguments go to one pytest run over what they select.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy .
.venv/bin/titoflow docs --check
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
rest_log="$(mktemp -t titoflow-tests-rest.XXXXXX)"
nice -n 10 .venv/bin/python -m pytest -m "not engine and not processes" -p no:cacheprovider >"$rest_log" 2>&1 &
rest=$!
# Whatever ends this script ends the other half too, and removes its log.
trap 'kill "$rest" 2>/dev/null || true; rm -f "$rest_log"' EXIT
set +e
.venv/bin/python -m pytest -m "engine or processes"
engine_status=$?
wait "$rest"
rest_status=$?
set -e
echo
echo "========== the rest (-m 'not engine and not processes'), run beside the above =========="
cat "$rest_log"
echo "engine and process tests: exit $engine_status; the rest: exit $rest_status"
[ "$engine_status" -eq 0 ] && [ "$rest_status" -eq 0 ]

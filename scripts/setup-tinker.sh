#!/usr/bin/env bash
# Create <repo>/.venv-tinker: tinker-cookbook's own code for tests/trainers/test_trainer_tinker.py, which
# runs its RL data path (compute_advantages, assemble_training_data), train_step and
# compute_kl_sample_train against a training client that runs on CPU. tinker-cookbook's
# requirements carry service, logging and tokenizer packages that path never imports, so it
# goes in --no-deps with a pinned minimal set: what importing tinker_cookbook.rl.train needs
# (datasets and pandas: its supervised data module), and transformers for the policy's forward.
# Idempotent: does nothing when that python already imports what the test uses.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-tinker"
py="$venv/bin/python"
pip=("$py" -m pip --quiet --disable-pip-version-check)
check="import tinker_cookbook.rl.train, tinker_cookbook.rl.metrics, transformers, torch"

if [[ -x "$py" ]] && "$py" -c "$check" >/dev/null 2>&1; then
    echo "tinker environment ready: $venv"
    exit 0
fi

# tinker and tinker-cookbook require CPython 3.11 or later.
"${PYTHON:-python3.11}" -m venv "$venv"
# One resolver-free install: the engine's torch (on these machines pip resolves it to the local
# CPU-only wheel) with its own dependencies, the tinker client, tinker-cookbook, and transformers.
"${pip[@]}" install --no-deps \
    "tinker-cookbook==0.6.1" "tinker==0.38.0" "torch==2.13.0" "filelock==4.3.1" \
    "typing-extensions==4.16.0" "sympy==1.14.0" "mpmath==1.3.0" "networkx==3.6.1" \
    "jinja2==3.1.6" "markupsafe==3.0.4" "fsspec==2026.9.0" "numpy==2.3.5" "chz==0.4.0" \
    "pydantic==2.14.4" "pydantic-core==2.50.5" "typing-inspection==0.4.5" \
    "annotated-types==0.8.0" "httpx==0.28.1" "httpcore==1.0.9" "h11==0.16.0" "anyio==4.16.0" \
    "sniffio==1.3.1" "idna==3.20" "certifi==2026.10.19.post1" "distro==1.9.0" "orjson==3.13.0" \
    "protobuf==7.36.2" "pillow==13.0.0" "tqdm==4.70.1" "termcolor==3.3.0" "rich==15.0.0" \
    "blobfile==3.3.0" "urllib3==2.8.0" "lxml==6.1.3" "datasets==5.2.0" "dill==0.4.1" \
    "multiprocess==0.70.19" "xxhash==4.1.0" "pyarrow==26.0.1" "pandas==3.1.1" \
    "python-dateutil==4.0.0" "pyyaml==6.0.4" "packaging==26.4" "transformers==5.15.0" \
    "huggingface-hub==1.33.0" "tokenizers==0.22.2" "safetensors==0.8.0" "regex==2026.11.19" \
    "click==8.5.1" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
"$py" -c "$check; import tinker_cookbook; print('tinker environment ready: tinker-cookbook', tinker_cookbook.__version__, 'torch', torch.__version__)"

#!/usr/bin/env bash
# Create <repo>/.venv-tinker: tinker-cookbook's own code for tests/trainers/test_trainer_tinker.py, which
# runs its RL data path (compute_advantages, assemble_training_data), train_step and
# compute_kl_sample_train against a training client that runs on CPU. tinker-cookbook's
# requirements carry service, logging and tokenizer packages that path never imports, so it
# goes in --no-deps with a pinned minimal set: what importing tinker_cookbook.rl.train needs
# (datasets and pandas: its supervised data module), and transformers for the policy's forward.
# Idempotent: does nothing when that python already imports what the test uses.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/side-venv.sh" .venv-tinker
check="import tinker_cookbook.rl.train, tinker_cookbook.rl.metrics, transformers, torch"
# tinker and tinker-cookbook require CPython 3.11 or later.
ready_or_new tinker "$check"
# One resolver-free install: the engine's torch, transformers, the tinker client,
# tinker-cookbook, and what importing tinker_cookbook.rl.train needs.
pip_install --no-deps "tinker-cookbook==0.6.1" "tinker==0.38.0" "${torch_pins[@]}" \
    "${transformers_pins[@]}" "chz==0.4.0" "pydantic==2.14.4" "pydantic-core==2.50.5" \
    "typing-inspection==0.4.5" "annotated-types==0.8.0" "sniffio==1.3.1" "distro==1.9.0" \
    "orjson==3.13.0" "protobuf==7.36.2" "pillow==13.0.0" "termcolor==3.3.0" "rich==15.0.0" \
    "blobfile==3.3.0" "urllib3==2.8.0" "lxml==6.1.3" "datasets==5.2.0" "dill==0.4.1" \
    "multiprocess==0.70.19" "xxhash==4.1.0" "pyarrow==26.0.1" "pandas==3.1.1" \
    "python-dateutil==4.0.0"
"$py" -c "$check; import tinker_cookbook; print('tinker environment ready: tinker-cookbook', tinker_cookbook.__version__, 'torch', torch.__version__)"

#!/usr/bin/env bash
# Create <repo>/.venv-verl: verl's own code for tests/trainers/test_trainer_verl.py, which runs its FSDP
# actor (DataParallelPPOActor: compute_log_prob, update_policy), GRPO advantage and rollout
# correction on CPU. verl 0.7.1 is the last release that ships that actor (0.8 dropped
# verl/workers/actor); it pulls in GPU, logging and dataset packages that path never imports,
# so it goes in --no-deps with a pinned minimal set. ray stays in: verl/protocol.py imports it.
# verl's current release (0.9.1: model-engine workers, numpy>=2, transformers 5) goes in
# <venv>/verl-current (pip --target), first on sys.path for tests/support/verl_current_step.py, over the
# same torch, tensordict and ray: only what its data path, losses and FSDP engine import.
# Idempotent: does nothing when that python already imports what the tests use.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/side-venv.sh" .venv-verl
check="import verl.workers.actor.dp_actor, verl.trainer.ppo.rollout_corr_helper, transformers"

current="$venv/verl-current"
current_check="import verl, verl.workers.engine.fsdp.transformer_impl, verl.workers.utils.losses, \
verl.trainer.ppo.rollout_corr_helper; assert verl.__version__ == '0.9.1', verl.__version__"

if [[ -x "$py" ]] && "$py" -c "$check" >/dev/null 2>&1 \
    && PYTHONPATH="$current" "$py" -c "$current_check" >/dev/null 2>&1; then
    echo "verl environment ready: $venv"
    exit 0
fi

if ! { [[ -x "$py" ]] && "$py" -c "$check" >/dev/null 2>&1; }; then
    "${PYTHON:-python3.11}" -m venv "$venv"
    # The engine's torch: on these machines pip resolves it to the local CPU-only wheel.
    pip_install "torch==2.13.0"
    # verl's own pins (numpy<2, tensordict<=0.10) and the transformers of its release; the rest is
    # what importing verl's protocol, configs, actor and rollout-correction helpers needs.
    pip_install --no-deps \
        "verl==0.7.1" "tensordict==0.10.0" "pyvers==0.2.3" "cloudpickle==3.1.3" "numpy==1.26.4" \
        "transformers==4.57.6" "huggingface-hub==0.36.2" "tokenizers==0.22.2" "safetensors==0.8.0" "regex==2026.11.19" \
        "tqdm==4.70.1" "pyyaml==6.0.4" "packaging==26.4" "filelock==4.3.1" "fsspec==2026.9.0" \
        "omegaconf==2.3.0" "antlr4-python3-runtime==4.9.3" "codetiming==1.4.0" \
        "ray==2.53.0" "msgpack==1.2.4" "protobuf==7.36.2" "click==8.5.1" "requests==2.34.2" \
        "urllib3==2.8.0" "idna==3.20" "certifi==2026.10.19.post1" "charset-normalizer==3.5.3" \
        "jsonschema==4.26.0" "jsonschema-specifications==2025.9.1" "referencing==0.37.0" \
        "rpds-py==2026.9.1" "attrs==26.1.0"
fi
"$py" -c "$check; import verl, torch; print('verl environment ready: verl', verl.__version__, 'torch', torch.__version__)"

# verl 0.9.1's own pins (numpy>=2, transformers>=5.5.3,<5.11: its cpu extra's 5.9.0) and what
# importing its protocol, losses, rollout correction and FSDP engine pulls in (datasets and
# pyarrow through verl.utils.dataset, peft, accelerate, torchdata, pydantic); nothing of its
# rollout servers, trackers or GPU kernels.
if ! PYTHONPATH="$current" "$py" -c "$current_check" >/dev/null 2>&1; then
    rm -rf "$current"
    pip_install --no-deps --target "$current" \
        "verl==0.9.1" "numpy==2.4.6" "transformers==5.9.0" "huggingface-hub==1.33.0" \
        "httpx==0.28.1" "httpcore==1.0.9" "h11==0.16.0" "anyio==4.12.1" "orjson==3.13.0" \
        "datasets==5.2.0" "multiprocess==0.70.19" "dill==0.4.1" "xxhash==4.1.0" "pyarrow==26.0.1" \
        "pandas==3.1.1" "python-dateutil==4.0.0" "pillow==13.0.0" "peft==0.21.2" "accelerate==1.15.0" \
        "torchdata==0.11.0" "pydantic==2.14.4" "pydantic-core==2.50.5" "typing-inspection==0.4.5" \
        "annotated-types==0.8.0" "cachetools==8.0.2"
fi
PYTHONPATH="$current" "$py" -c "$current_check; print('verl current release ready: verl', verl.__version__)"

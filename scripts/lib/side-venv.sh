# Sourced by the setup scripts that build an environment beside .venv (engine, trainers): where it
# lives, how its pip is called, and the one line of pip's noise the installs leave out.
# Usage: source "$(dirname "${BASH_SOURCE[0]}")/lib/side-venv.sh" .venv-NAME
# Sets root (the repository), venv, py and pip (an array: the venv's quiet pip).

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/$1"
py="$venv/bin/python"
pip=("$py" -m pip --quiet --disable-pip-version-check)

# For the trainers' resolver-free (--no-deps) installs: the engine's torch (on these machines pip
# resolves it to the local CPU-only wheel) with its own dependencies, and transformers 5.15 with
# what importing it and its hub client needs.
torch_pins=(
    "torch==2.13.0" "filelock==4.3.1" "typing-extensions==4.16.0" "sympy==1.14.0" "mpmath==1.3.0"
    "networkx==3.6.1" "jinja2==3.1.6" "markupsafe==3.0.4" "fsspec==2026.9.0"
)
transformers_pins=(
    "transformers==5.15.0" "huggingface-hub==1.33.0" "tokenizers==0.22.2" "safetensors==0.8.0"
    "numpy==2.3.5" "pyyaml==6.0.4" "regex==2026.11.19" "tqdm==4.70.1" "packaging==26.4"
    "httpx==0.28.1" "httpcore==1.0.9" "h11==0.16.0" "anyio==4.16.0" "idna==3.20"
    "certifi==2026.10.19.post1" "click==8.5.1"
)

# pip_install ARGS...: the venv's pip install, less pip's "is ignored: it is neither a file nor a
# directory" lines (a configured find-links location this machine lacks); the scripts' closing
# import checks catch a failed install.
pip_install() {
    "${pip[@]}" install "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
}

# ready_or_new WHAT CHECK: ends the script when the venv's python already runs CHECK (the
# scripts are idempotent); otherwise makes the venv from ${PYTHON:-python3.11}.
ready_or_new() {
    if [[ -x "$py" ]] && "$py" -c "$2" >/dev/null 2>&1; then
        echo "$1 environment ready: $venv"
        exit 0
    fi
    "${PYTHON:-python3.11}" -m venv "$venv"
}

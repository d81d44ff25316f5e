#!/usr/bin/env bash
# Install the real agent scaffolds used by the opt-in tests (tests/e2e/test_scaffolds.py) and described
# in docs/scaffolds.md, at pinned versions, into a project-local prefix: <repo>/.tools/npm
# (binaries in .tools/npm/bin). Uses the machine's node/npm and the npm registry; nothing global.
# Idempotent: a client whose installed binary already reports the pinned version is skipped.
#
#   bash scripts/setup-scaffolds.sh        # then: TITOFLOW_SCAFFOLD_TESTS=1 pytest tests/e2e/test_scaffolds.py
#
# Override a pin with CLAUDE_CODE_VERSION / OPENCODE_VERSION / CODEX_VERSION (not recommended:
# these are the versions whose requests are documented in docs/scaffolds.md).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$root/.tools/npm"

claude_version="${CLAUDE_CODE_VERSION:-2.1.197}"
opencode_version="${OPENCODE_VERSION:-1.18.33}"
codex_version="${CODEX_VERSION:-0.169.0}"

die() {
    echo "setup-scaffolds: $*" >&2
    exit 1
}

command -v node >/dev/null 2>&1 || die "node is not on PATH (needs Node.js >= 18; 20.x was used)"
command -v npm >/dev/null 2>&1 || die "npm is not on PATH"
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[[ "$node_major" -ge 18 ]] || die "Node.js $(node --version) is too old (needs >= 18)"

mkdir -p "$prefix"

# The npm flags for a project-local, reproducible install: a --global install into our own
# prefix (bin/ + lib/node_modules/), no audit/fund/update-notifier traffic. Install scripts stay
# enabled: OpenCode's postinstall links its platform binary.
npm_install=(npm install --global --prefix "$prefix" --no-audit --no-fund --no-update-notifier
    --loglevel=error)

# installed_version BIN ARGS...: what the installed binary reports, or nothing.
installed_version() {
    local bin="$prefix/bin/$1"
    shift
    [[ -x "$bin" ]] || return 0
    # Keep the client from phoning home while it answers --version.
    env DISABLE_AUTOUPDATER=1 OPENCODE_DISABLE_AUTOUPDATE=1 \
        HOME="$prefix/.home" XDG_CONFIG_HOME="$prefix/.home/.config" \
        XDG_DATA_HOME="$prefix/.home/.local/share" XDG_CACHE_HOME="$prefix/.home/.cache" \
        XDG_STATE_HOME="$prefix/.home/.local/state" CODEX_HOME="$prefix/.home/.codex" \
        timeout 60 "$bin" "$@" 2>/dev/null | head -n 1 || true
}

# ensure PACKAGE VERSION BIN: install PACKAGE@VERSION unless BIN --version already reports it.
ensure() {
    local package="$1" version="$2" bin="$3" have
    have="$(installed_version "$bin" --version)"
    if [[ "$have" == *"$version"* ]]; then
        echo "$package@$version already installed ($prefix/bin/$bin: $have)"
        return 0
    fi
    # Fail loudly and early when the registry does not have this exact version.
    local listed
    listed="$(npm view "$package@$version" version 2>/dev/null || true)"
    if [[ "$listed" != "$version" ]]; then
        echo "setup-scaffolds: $package@$version is not on the registry; available:" >&2
        npm view "$package" versions --json 2>/dev/null |
            grep -E '^ *"[0-9]+\.[0-9]+\.[0-9]+",?$' | tail -n 10 >&2 || true
        die "pick the nearest available version with the override variable and re-run"
    fi
    echo "installing $package@$version into $prefix"
    "${npm_install[@]}" "$package@$version" || die "npm install $package@$version failed"
    have="$(installed_version "$bin" --version)"
    [[ "$have" == *"$version"* ]] ||
        die "$prefix/bin/$bin --version says '${have:-nothing}', expected $version"
    echo "installed $package@$version ($prefix/bin/$bin: $have)"
}

ensure "@anthropic-ai/claude-code" "$claude_version" claude
ensure "opencode-ai" "$opencode_version" opencode
ensure "@openai/codex" "$codex_version" codex

rm -rf "$prefix/.home" # only used to keep the --version probes isolated
echo "scaffolds ready in $prefix/bin (claude, opencode, codex)"

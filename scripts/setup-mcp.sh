#!/usr/bin/env bash
# Installs the real MCP servers the External MCP tests and `mira bench mcp` talk to, and prints
# `export` lines with their paths (scripts/test.sh evals them). Idempotent: everything is cached
# under ./.cache/mcp and reinstalled only when a pinned version changes.
#   npm:  @modelcontextprotocol/server-everything, server-filesystem, server-memory, and the
#         official conformance suite (@modelcontextprotocol/conformance) for the runtime's own
#         MCP server
#   PyPI: mcp-server-time (brings the `mcp` SDK, which the project's own test servers in
#         tests/mcp/ use) into a virtual environment
# Everything is logged to stderr; only the export lines go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD/.cache/mcp"
NPM_DIR="$ROOT/npm"
VENV="$ROOT/venv"
NPM_PKGS=(
  "@modelcontextprotocol/server-everything@2026.8.31"
  "@modelcontextprotocol/server-filesystem@2026.8.31"
  "@modelcontextprotocol/server-memory@2026.8.31"
  "@modelcontextprotocol/conformance@0.1.16"
)
PY_PKGS=("mcp-server-time==2026.10.19")
mkdir -p "$ROOT"
{
  command -v node >/dev/null || { echo "setup-mcp: node is required (apt-get install nodejs npm)"; exit 1; }
  command -v python3 >/dev/null || { echo "setup-mcp: python3 is required"; exit 1; }
  stamp="$NPM_DIR/.installed"
  if [ "$(cat "$stamp" 2>/dev/null)" != "${NPM_PKGS[*]}" ]; then
    echo "setup-mcp: npm install ${NPM_PKGS[*]}"
    mkdir -p "$NPM_DIR"
    [ -f "$NPM_DIR/package.json" ] || echo '{"name":"mira-mcp-test-servers","private":true}' > "$NPM_DIR/package.json"
    npm install --prefix "$NPM_DIR" --no-audit --no-fund --save-exact "${NPM_PKGS[@]}"
    echo "${NPM_PKGS[*]}" > "$stamp"
  fi
  stamp="$VENV/.installed"
  if [ "$(cat "$stamp" 2>/dev/null)" != "${PY_PKGS[*]}" ]; then
    echo "setup-mcp: pip install ${PY_PKGS[*]}"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_PKGS[@]}"
    echo "${PY_PKGS[*]}" > "$stamp"
  fi
  for bin in mcp-server-everything mcp-server-filesystem mcp-server-memory; do
    [ -e "$NPM_DIR/node_modules/.bin/$bin" ] || { echo "setup-mcp: $bin missing after install"; exit 1; }
  done
  [ -f "$NPM_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js" ] || { echo "setup-mcp: the conformance suite is missing after install"; exit 1; }
  [ -x "$VENV/bin/mcp-server-time" ] || { echo "setup-mcp: mcp-server-time missing after install"; exit 1; }
  "$VENV/bin/python" -c 'from mcp.server.mcpserver import MCPServer' || { echo "setup-mcp: the mcp SDK does not import"; exit 1; }
} >&2
echo "export MIRA_MCP_EVERYTHING=$NPM_DIR/node_modules/.bin/mcp-server-everything"
echo "export MIRA_MCP_FILESYSTEM=$NPM_DIR/node_modules/.bin/mcp-server-filesystem"
echo "export MIRA_MCP_MEMORY=$NPM_DIR/node_modules/.bin/mcp-server-memory"
echo "export MIRA_MCP_TIME=$VENV/bin/mcp-server-time"
echo "export MIRA_MCP_PYTHON=$VENV/bin/python"
echo "export MIRA_MCP_CONFORMANCE=$NPM_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"
echo "export MIRA_MCP_SERVERS=$PWD/tests/mcp"

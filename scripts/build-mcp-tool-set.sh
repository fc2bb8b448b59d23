#!/usr/bin/env bash
# Rebuilds bench/mcp-servers/tools.json: the real tool definitions of ten reference MCP
# servers, read with the MCP handshake and `tools/list` over stdio (scripts/mcp-list-tools.mjs).
# Installs the servers from npm into .cache/mcp-set (idempotent). The queries in
# bench/mcp-servers/queries.jsonl are hand-written and name these tool ids.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=$root/.cache/mcp-set
mkdir -p "$cache" "$cache/ws"
cd "$cache"
pkgs=(server-filesystem@2026.8.31 server-memory@2026.8.31 server-everything@2026.8.31 server-github@2025.4.8
    server-slack@2025.4.25 server-google-maps@0.6.2 server-brave-search@0.6.2 server-gitlab@2025.4.25
    server-sequential-thinking@2026.8.31 server-postgres@0.6.2)
npm install --no-audit --no-fund --silent "${pkgs[@]/#/@modelcontextprotocol/}" >&2
cp "$root/scripts/mcp-list-tools.mjs" .
node mcp-list-tools.mjs "filesystem @modelcontextprotocol/server-filesystem $cache/ws" \
    "memory @modelcontextprotocol/server-memory" "everything @modelcontextprotocol/server-everything" \
    "github @modelcontextprotocol/server-github" "slack @modelcontextprotocol/server-slack" \
    "maps @modelcontextprotocol/server-google-maps" "brave @modelcontextprotocol/server-brave-search" \
    "gitlab @modelcontextprotocol/server-gitlab" "thinking @modelcontextprotocol/server-sequential-thinking" \
    "postgres @modelcontextprotocol/server-postgres postgresql://localhost/none" >"$root/bench/mcp-servers/tools.json"
echo "wrote $root/bench/mcp-servers/tools.json" >&2

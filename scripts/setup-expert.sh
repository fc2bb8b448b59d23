#!/usr/bin/env bash
# Installs what the External Expert tests (tests/it/expert.rs) and `mira bench expert` need: the
# A2A Python SDK with its HTTP server extra, and uvicorn, into a virtual environment under
# ./.cache/expert, for the scripted expert tests/expert/expert_server.py. Prints `export` lines
# (scripts/test.sh evals them). Idempotent: reinstalled only when a pinned version changes.
# Everything is logged to stderr; only the export lines go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD/.cache/expert"
VENV="$ROOT/venv"
PY_PKGS=("a2a-sdk[http-server]==1.3.0" "uvicorn==0.38.0")
mkdir -p "$ROOT"
{
  command -v python3 >/dev/null || { echo "setup-expert: python3 is required"; exit 1; }
  stamp="$VENV/.installed"
  if [ "$(cat "$stamp" 2>/dev/null)" != "${PY_PKGS[*]}" ]; then
    echo "setup-expert: pip install ${PY_PKGS[*]}"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_PKGS[@]}"
    echo "${PY_PKGS[*]}" > "$stamp"
  fi
  "$VENV/bin/python" -c 'import a2a.server.routes, uvicorn, sse_starlette' \
    || { echo "setup-expert: a2a-sdk[http-server] does not import"; exit 1; }
} >&2
echo "export MIRA_EXPERT_PYTHON=$VENV/bin/python"
echo "export MIRA_EXPERT_SERVER=$PWD/tests/expert/expert_server.py"

#!/usr/bin/env bash
# Installs schemathesis (PyPI, pinned) into a virtual environment under ./.cache/schemathesis
# for the property-based API test (tests/it/schemathesis.rs), and prints the `export` line with
# its path (scripts/test.sh evals it). Idempotent: reinstalled only when the pin changes.
# Progress goes to stderr; stdout carries only the export line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$PWD/.cache/schemathesis/venv"
# schemathesis and everything it pulls in, pinned: a new release of a dependency (Hypothesis
# publishes several a week) must not change what CI generates.
PKGS=(
  schemathesis==4.32.5 hypothesis==6.170.27 hypothesis-graphql==0.13.5 anyio==4.16.0
  certifi==2026.10.19.post1 charset-normalizer==3.5.3 click==8.5.1 graphql-core==3.3.2 harfile==0.6.0
  idna==3.20 iniconfig==2.3.1 jsonschema_rs==0.60.3 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mdurl==0.1.2
  packaging==26.4 pluggy==1.7.0 Pygments==2.21.0 pyrate-limiter==4.6.0 pytest==9.2.0 PyYAML==6.0.4
  requests==2.34.2 rich==15.0.0 sortedcontainers==2.4.0 typing_extensions==4.16.0 urllib3==2.8.0
  Werkzeug==3.1.9
)
{
  command -v python3 >/dev/null || { echo "setup-schemathesis: python3 is required"; exit 1; }
  stamp="$VENV/.installed"
  # A venv copied or moved from another folder keeps that folder in its scripts: start again.
  if [ -e "$stamp" ] && ! "$VENV/bin/st" --version >/dev/null 2>&1; then rm -rf "$VENV"; fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "${PKGS[*]}" ]; then
    echo "setup-schemathesis: pip install ${PKGS[*]}"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}"
    echo "${PKGS[*]}" > "$stamp"
  fi
  "$VENV/bin/st" --version >/dev/null || { echo "setup-schemathesis: st does not run"; exit 1; }
} >&2
echo "export MIRA_SCHEMATHESIS=$VENV/bin/st"

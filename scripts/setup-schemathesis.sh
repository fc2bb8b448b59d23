#!/usr/bin/env bash
# Installs schemathesis (PyPI, pinned) into a virtual environment under ./.cache/schemathesis
# for the property-based API test (tests/it/schemathesis.rs), and prints the `export` line with
# its path (scripts/test.sh evals it). Idempotent: reinstalled only when the pin changes.
# Progress goes to stderr; stdout carries only the export line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$PWD/.cache/schemathesis/venv"
PKGS=("schemathesis==4.32.5")
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

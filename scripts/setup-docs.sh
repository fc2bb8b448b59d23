#!/usr/bin/env bash
# What tests/it/docs.rs needs to run the README's example as written: bash, curl and jq
# (Debian packages; installed with apt-get when missing, which needs root). Prints nothing
# on stdout (scripts/test.sh evals it).
set -euo pipefail
missing=()
for tool in curl jq; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-docs: installing ${missing[*]} (apt)" >&2
  [ "$(id -u)" -eq 0 ] || { echo "setup-docs: ${missing[*]} missing and not root; install them (apt-get install ${missing[*]})" >&2; exit 1; }
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

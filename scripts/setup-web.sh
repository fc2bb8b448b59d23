#!/usr/bin/env bash
# Installs what the browser tests of the web page (tests/it/web.rs → tests/web/e2e.mjs) need:
# Debian's `chromium` (apt) and `playwright-core` (npm, pinned by tests/web/package-lock.json,
# installed with `npm ci` into tests/web/node_modules, npm cache under ./.cache/npm).
# Idempotent; fails loudly. Progress goes to stderr; stdout carries only `export` lines,
# which scripts/test.sh evaluates.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if ! command -v chromium >/dev/null 2>&1; then
  echo "setup-web: installing chromium (apt)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium >&2
fi
chromium_bin=$(command -v chromium)

for tool in node npm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup-web: $tool is required (Node.js 20 or newer with npm)" >&2; exit 1; }
done
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "setup-web: playwright-core needs Node.js 20 or newer; this is $(node --version)" >&2
  exit 1
fi

stamp=tests/web/node_modules/.mira-lock.sha256
want=$(sha256sum tests/web/package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup-web: npm ci in tests/web" >&2
  (cd tests/web && npm ci --no-audit --no-fund --cache "$root/.cache/npm" >&2)
  echo "$want" >"$stamp"
fi
node -e "require.resolve('playwright-core', {paths: ['$root/tests/web']})" >/dev/null \
  || { echo "setup-web: playwright-core did not install" >&2; exit 1; }

echo "export MIRA_WEB_CHROMIUM=$chromium_bin"

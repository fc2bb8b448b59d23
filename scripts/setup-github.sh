#!/usr/bin/env bash
# Installs the mock GitHub API servers the GitHub tests (tests/it/github.rs) talk to, and prints
# `export` lines with their paths (scripts/test.sh evals them). Idempotent: everything is cached
# under ./.cache/github and reinstalled only when a pinned version changes.
#   @octokit/fixtures-server  replays the recorded real GitHub API responses of @octokit/fixtures
#                             (a request must match a recorded one exactly, else 404/500)
#   @stoplight/prism-cli      mocks every operation of an OpenAPI description (5.14.2: the last
#                             release that runs on Node 20; 5.15+ needs Node >= 24.14)
#   @octokit/openapi          GitHub's published OpenAPI description (api.github.com, 3.0)
# Prism needs ~10 s and ~1 GB to load the full 11 MB description, so the script also writes a
# trimmed copy with only the paths the GitHub tools use (MIRA_GITHUB_OPENAPI_TRIMMED, loads in
# about a second).
# Everything is logged to stderr; only the export lines go to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD/.cache/github"
NPM_DIR="$ROOT/npm"
NPM_PKGS=(
  "@octokit/fixtures-server@8.1.7"
  "@stoplight/prism-cli@5.14.2"
  "@octokit/openapi@23.0.2"
)
mkdir -p "$ROOT"
{
  command -v node >/dev/null || { echo "setup-github: node is required (apt-get install nodejs npm)"; exit 1; }
  stamp="$NPM_DIR/.installed"
  if [ "$(cat "$stamp" 2>/dev/null)" != "${NPM_PKGS[*]}" ]; then
    echo "setup-github: npm install ${NPM_PKGS[*]}"
    mkdir -p "$NPM_DIR"
    [ -f "$NPM_DIR/package.json" ] || echo '{"name":"mira-github-test-servers","private":true}' > "$NPM_DIR/package.json"
    npm install --prefix "$NPM_DIR" --no-audit --no-fund --save-exact "${NPM_PKGS[@]}"
    echo "${NPM_PKGS[*]}" > "$stamp"
  fi
  for bin in octokit-fixtures-server prism; do
    [ -e "$NPM_DIR/node_modules/.bin/$bin" ] || { echo "setup-github: $bin missing after install"; exit 1; }
  done
  spec="$NPM_DIR/node_modules/@octokit/openapi/generated/api.github.com.json"
  [ -f "$spec" ] || { echo "setup-github: $spec missing after install"; exit 1; }
  trimmed="$ROOT/api.github.com.trimmed.json"
  if [ ! -s "$trimmed" ] || [ "$spec" -nt "$trimmed" ] || [ scripts/github-trim-openapi.mjs -nt "$trimmed" ]; then
    echo "setup-github: trimming $spec"
    node scripts/github-trim-openapi.mjs "$spec" "$trimmed.tmp"
    mv "$trimmed.tmp" "$trimmed"
  fi
} >&2
echo "export MIRA_GITHUB_FIXTURES_SERVER=$NPM_DIR/node_modules/.bin/octokit-fixtures-server"
echo "export MIRA_GITHUB_PRISM=$NPM_DIR/node_modules/.bin/prism"
echo "export MIRA_GITHUB_OPENAPI=$NPM_DIR/node_modules/@octokit/openapi/generated/api.github.com.json"
echo "export MIRA_GITHUB_OPENAPI_TRIMMED=$ROOT/api.github.com.trimmed.json"
echo "export MIRA_GITHUB_FIXTURES=$NPM_DIR/node_modules/@octokit/fixtures/scenarios/api.github.com"

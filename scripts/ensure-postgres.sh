#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers at TEST_DATABASE_URL (default the local server);
# starts the local Debian cluster when it is installed but stopped.
set -euo pipefail
URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
ready() { pg_isready -q -d "$URL" 2>/dev/null; }
if ready; then exit 0; fi
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  echo "starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
for _ in $(seq 1 30); do ready && exit 0; sleep 1; done
echo "PostgreSQL is not reachable at $URL" >&2
exit 1

#!/usr/bin/env bash
# What the private-cluster tests need (tests/it/private_pg.rs, tests/it/postgres_tls.rs): the
# PostgreSQL 15 server binaries (initdb, pg_ctl: Debian postgresql-15), runuser (util-linux)
# to run them as the `postgres` user, and the openssl CLI that makes the test certificates.
# Installed with apt-get when missing (needs root). Prints nothing on stdout (scripts/test.sh
# evals it).
set -euo pipefail
missing=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-private-pg: installing ${missing[*]} (apt)" >&2
  [ "$(id -u)" -eq 0 ] || { echo "setup-private-pg: ${missing[*]} missing and not root; install them (apt-get install ${missing[*]})" >&2; exit 1; }
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
id postgres >/dev/null 2>&1 || { echo "setup-private-pg: no 'postgres' user (it comes with postgresql-15)" >&2; exit 1; }

#!/usr/bin/env bash
# What scripts/cluster.sh (and the cluster tests, tests/it/cluster.rs) need: the Debian
# `haproxy` load balancer, installed with apt-get when missing (needs root). Idempotent.
# Prints the export line scripts/test.sh evals: MIRA_HAPROXY=<path>.
set -euo pipefail
{
  if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
    echo "setup-cluster: installing haproxy (apt)"
    [ "$(id -u)" -eq 0 ] || { echo "setup-cluster: haproxy missing and not root; install it (apt-get install haproxy)"; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy
  fi
} >&2
bin=$(command -v haproxy || echo /usr/sbin/haproxy)
[ -x "$bin" ] || { echo "setup-cluster: haproxy not found after install" >&2; exit 1; }
echo "export MIRA_HAPROXY=$bin"

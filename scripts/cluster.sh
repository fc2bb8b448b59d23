#!/usr/bin/env bash
# Starts N `mira serve` replicas on loopback against one Postgres database, behind a real
# load balancer (haproxy, round robin, health-checked on /readyz); or stops them.
#
#   scripts/cluster.sh start --database-url postgres://… [--replicas 3] [--dir DIR]
#                            [--bin target/debug/mira] [--port 0] [-- extra `mira serve` flags]
#   scripts/cluster.sh stop --dir DIR
#
# `start` prints export lines (eval them): MIRA_CLUSTER_DIR, MIRA_CLUSTER_URL (the load
# balancer), MIRA_ADMIN_TOKEN (the bootstrap admin's token, when this start created it).
# DIR (default: a new /tmp/mira-cluster.XXXX) holds, per replica i (1..N), r<i>/data (its data
# directory, so its own node id), r<i>.port, r<i>.pid and r<i>.log; ws/ is the shared default
# workspace; haproxy.cfg, haproxy.pid, lb.port, secret (the generated cluster secret,
# mode 0600) and secret.key (the generated MIRA_SECRET_KEY every replica shares, mode 0600,
# unless MIRA_SECRET_KEY is set: sealed secrets and the runner signing key must be the same on
# every replica) complete it. Replicas reach each other at http://127.0.0.1:<port> with that secret.
# Needs haproxy (scripts/setup-cluster.sh installs it) and python3 (to pick free ports).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "cluster.sh: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ready() { # port pid log
  for _ in $(seq 1 600); do
    kill -0 "$2" 2>/dev/null || { tail -n 20 "$3" >&2; die "replica on port $1 exited"; }
    curl -fsS "http://127.0.0.1:$1/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "replica on port $1 not ready after 60 s (see $3)"
}

cmd=${1:-}; shift || true
replicas=3 dir="" bin="" url="${DATABASE_URL:-}" lb_port=0 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --database-url) url=$2; shift 2 ;;
    --port) lb_port=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1" ;;
  esac
done

case "$cmd" in
  start)
    [ -n "$url" ] || die "--database-url (or DATABASE_URL) is required: replicas share one Postgres database"
    case "$url" in postgres:*|postgresql:*) ;; *) die "replicas need Postgres, not $url" ;; esac
    [ -n "$bin" ] || bin=target/debug/mira
    [ -x "$bin" ] || die "$bin is not built (cargo build, or --bin PATH)"
    haproxy=${MIRA_HAPROXY:-$(command -v haproxy || echo /usr/sbin/haproxy)}
    [ -x "$haproxy" ] || die "haproxy not found: run scripts/setup-cluster.sh"
    [ -n "$dir" ] || dir=$(mktemp -d /tmp/mira-cluster.XXXXXX)
    mkdir -p "$dir/ws"
    dir=$(cd "$dir" && pwd -P)
    if [ ! -s "$dir/secret" ]; then
      (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/secret")
    fi
    if [ ! -s "$dir/secret.key" ]; then
      (umask 077; head -c 32 /dev/urandom | base64 | tr -d '\n' > "$dir/secret.key")
    fi
    secret_key=${MIRA_SECRET_KEY:-$(cat "$dir/secret.key")}
    servers=""
    for i in $(seq 1 "$replicas"); do
      port=$(free_port)
      mkdir -p "$dir/r$i/data"
      MIRA_CLUSTER_SECRET=$(cat "$dir/secret") MIRA_SECRET_KEY="$secret_key" DATABASE_URL="$url" \
        nohup "$bin" serve --listen "127.0.0.1:$port" --data-dir "$dir/r$i/data" --workspace "$dir/ws" \
        ${extra[@]+"${extra[@]}"} >"$dir/r$i.log" 2>&1 &
      pid=$!
      echo "$pid" > "$dir/r$i.pid"
      echo "$port" > "$dir/r$i.port"
      # The first replica bootstraps the admin (and migrates) before the others start.
      [ "$i" -eq 1 ] && wait_ready "$port" "$pid" "$dir/r$i.log"
      servers+="    server r$i 127.0.0.1:$port check inter 500ms fall 2 rise 1"$'\n'
    done
    for i in $(seq 2 "$replicas"); do
      wait_ready "$(cat "$dir/r$i.port")" "$(cat "$dir/r$i.pid")" "$dir/r$i.log"
    done
    [ "$lb_port" != 0 ] || lb_port=$(free_port)
    cat > "$dir/haproxy.cfg" <<CFG
global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
frontend mira
    bind 127.0.0.1:$lb_port
    # The replicas forward to each other directly (their default internal URL is their own
    # listen address): /internal/* is not served through the load balancer.
    http-request deny deny_status 404 if { path_beg /internal/ }
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    retry-on conn-failure empty-response
    retries 2
    option redispatch
$servers
CFG
    "$haproxy" -f "$dir/haproxy.cfg" -D -p "$dir/haproxy.pid" >"$dir/haproxy.log" 2>&1 \
      || { cat "$dir/haproxy.log" >&2; die "haproxy did not start"; }
    echo "$lb_port" > "$dir/lb.port"
    for _ in $(seq 1 100); do
      curl -fsS "http://127.0.0.1:$lb_port/readyz" >/dev/null 2>&1 && break
      sleep 0.1
    done
    echo "export MIRA_CLUSTER_DIR=$dir"
    echo "export MIRA_CLUSTER_URL=http://127.0.0.1:$lb_port"
    [ -f "$dir/r1/data/admin.token" ] && echo "export MIRA_ADMIN_TOKEN=$(cat "$dir/r1/data/admin.token")"
    echo "cluster.sh: $replicas replicas behind http://127.0.0.1:$lb_port (logs in $dir)" >&2
    ;;
  stop)
    [ -n "$dir" ] || die "--dir is required"
    dir=$(cd "$dir" && pwd -P)
    # A pid file may outlive its process (a replica killed with -9 by a test, a crashed load
    # balancer) and the kernel reuses pids: only a process whose command line still names this
    # cluster's file (r<i>/data, haproxy.cfg) is signalled, never whoever has the pid now.
    ours() { # pidfile marker -> prints the pid when it is still the cluster's process
      [ -f "$1" ] || return 0
      local pid; pid=$(cat "$1")
      case "$pid" in ''|*[!0-9]*) return 0 ;; esac
      tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2" && echo "$pid" || true
    }
    pid=$(ours "$dir/haproxy.pid" "$dir/haproxy.cfg"); [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    for f in "$dir"/r*.pid; do
      i=${f##*/r}; i=${i%.pid}
      pid=$(ours "$f" "$dir/r$i/data"); [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    done
    for f in "$dir"/r*.pid; do
      i=${f##*/r}; i=${i%.pid}
      for _ in $(seq 1 150); do [ -n "$(ours "$f" "$dir/r$i/data")" ] || break; sleep 0.1; done
      [ -z "$(ours "$f" "$dir/r$i/data")" ] || echo "cluster.sh: replica $i (pid $(cat "$f")) is still running" >&2
    done
    echo "cluster.sh: stopped the cluster in $dir" >&2
    ;;
  *) die "usage: cluster.sh start|stop [options] (see the header of this script)" ;;
esac

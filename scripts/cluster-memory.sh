#!/usr/bin/env bash
# Memory per subscribed id, on the node and in Redis: one switchboard in
# cluster mode and one without Redis, each holding COUNT idle streams of
# COUNT distinct ids (floodtest, spread over 127.0.0.2-.5), one after the
# other in the same run. Prints each server's /stats bytes per connection
# (the difference is the bus's bookkeeping per id), the SUBSCRIBE commands it
# took, and redis-server's RSS and used_memory before and while the ids are
# subscribed. Only its own processes are stopped, by pid.
# Usage: scripts/cluster-memory.sh [COUNT=19000]
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-19000}
[[ "$COUNT" =~ ^[0-9]+$ && "$COUNT" -ge 1 && "$COUNT" -le 19000 ]] || { echo "COUNT is 1 to 19000 (one process's open files)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server" >&2; exit 1; }
cargo build --release -q --bin switchboard --bin floodtest
OUT=${OUT:-$(mktemp -d)}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPORT=$(free_port)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >/dev/null &
redis=$!; pids+=("$redis")
rcmd() { redis-cli -p "$RPORT" "$@"; }   # redis-cli comes with redis-server (redis-tools)
for _ in $(seq 1 50); do rcmd PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print $2 * 1024}' "/proc/$1/status"; }
used() { rcmd INFO memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'; }
r0=$(rss "$redis"); u0=$(used)
echo "redis-server idle: rss $r0, used_memory $u0"
for mode in cluster single; do
  port=$(free_port); admin=$(free_port)   # /stats: on the internal listener
  extra=(); [ $mode = cluster ] && extra=(SWITCHBOARD__CLUSTER__REDIS_URL=redis://127.0.0.1:$RPORT SWITCHBOARD__CLUSTER__PREFIX=mem)
  env "${extra[@]}" SWITCHBOARD__SERVER__PORT="$port" SWITCHBOARD__SERVER__ADMIN_PORT="$admin" SWITCHBOARD__LOG__LEVEL=warn \
    SWITCHBOARD__STREAM__TICK_INTERVAL_MS=600000 ./target/release/switchboard &
  server=$!; pids+=("$server")
  for _ in $(seq 1 50); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  ./target/release/floodtest --url "http://127.0.0.1:$port/test/m{n}" --count "$COUNT" --rate 5000 \
    --duration 25s --interval 5s --source-ips 127.0.0.2-127.0.0.5 >"$OUT/flood-$mode.out" 2>&1 &
  flood=$!; pids+=("$flood")
  for _ in $(seq 1 200); do
    curl -fs "http://127.0.0.1:$admin/stats" >"$OUT/stats-$mode.json" 2>/dev/null || true
    python3 -c "import json,sys; d=json.load(open('$OUT/stats-$mode.json')); sys.exit(0 if d['connections']['active']==$COUNT and d.get('cluster',{}).get('subscriptions',$COUNT)==$COUNT else 1)" 2>/dev/null && break
    sleep 0.1
  done
  sleep 3
  curl -fs "http://127.0.0.1:$admin/stats" >"$OUT/stats-$mode.json"
  python3 - "$OUT/stats-$mode.json" "$mode" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); c = d.get("cluster", {})
print(f"{sys.argv[2]}: streams {d['connections']['active']}, server bytes per stream {d['memory']['bytes_per_connection']}"
      + (f", subscriptions {c['subscriptions']} in {c['subscribe_commands']} SUBSCRIBE commands" if c else ""))
PY
  if [ $mode = cluster ]; then
    r1=$(rss "$redis"); u1=$(used)
    echo "redis-server with $COUNT ids subscribed: rss $r1 ($(( (r1 - r0) / COUNT )) B per id), used_memory $u1 ($(( (u1 - u0) / COUNT )) B per id)"
  fi
  wait "$flood" || true
  kill -TERM "$server"; wait "$server" || true
done

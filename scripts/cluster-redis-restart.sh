#!/usr/bin/env bash
# A Redis restart under load: `switchboard --processes 4` on one port with a
# redis-server this script starts; floodtest holds STREAMS streams (spread
# over the 4 processes by SO_REUSEPORT) and sends RATE msg/s to them through
# the shared port (so most cross processes). At OUTAGE_AT seconds redis-server
# is killed (SIGKILL), DOWN seconds later started again on the same port.
# Prints floodtest's per-second timeline (sent, 503s, received), its
# summary, and how many reconnects the nodes logged. Every loop is bounded; only
# its own processes are stopped, by pid.
# Usage: scripts/cluster-redis-restart.sh [STREAMS=10000] [RATE=1000] [SECONDS=40] [OUTAGE_AT=15] [DOWN=5]
set -euo pipefail
cd "$(dirname "$0")/.."
STREAMS=${1:-10000}; RATE=${2:-1000}; SECS=${3:-40}; AT=${4:-15}; DOWN=${5:-5}
for v in "$STREAMS" "$RATE" "$SECS" "$AT" "$DOWN"; do
  [[ "$v" =~ ^[0-9]+$ && "$v" -ge 1 ]] || { echo "arguments are positive whole numbers" >&2; exit 2; }
done
[ $((AT + DOWN + 5)) -le "$SECS" ] || { echo "OUTAGE_AT + DOWN + 5 must fit in SECONDS" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server" >&2; exit 1; }
cargo build --release -q --bin switchboard --bin floodtest
OUT=${OUT:-$(mktemp -d)}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPORT=$(free_port); PORT=$(free_port)
ADMIN=$(free_port)   # the fleet's internal listener (/cluster), shared as PORT is
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
start_redis() { redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >>"$OUT/redis.log" 2>&1 & redis=$!; pids+=("$redis"); }
start_redis
SWITCHBOARD__SERVER__PORT=$PORT SWITCHBOARD__SERVER__ADMIN_PORT=$ADMIN SWITCHBOARD__LOG__LEVEL=info,actix_web=warn SWITCHBOARD__CLUSTER__REDIS_URL=redis://127.0.0.1:$RPORT \
  SWITCHBOARD__CLUSTER__PREFIX=restart SWITCHBOARD__STREAM__TICK_INTERVAL_MS=600000 \
  ./target/release/switchboard --processes 4 >"$OUT/fleet.log" 2>&1 &
fleet=$!; pids+=("$fleet")
for _ in $(seq 1 100); do
  n=$(curl -fs "http://127.0.0.1:$ADMIN/cluster" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["nodes"])' 2>/dev/null || echo 0)
  [ "$n" = 4 ] && break; sleep 0.1
done
[ "$n" = 4 ] || { echo "the fleet did not come up with 4 nodes" >&2; exit 1; }
./target/release/floodtest --url "http://127.0.0.1:$PORT/test/r{n}" --count "$STREAMS" --rate 5000 \
  --duration "${SECS}s" --interval 1s --msg-rate "$RATE" --source-ips 127.0.0.2-127.0.0.5 \
  --stats-url "http://127.0.0.1:$ADMIN/cluster" --json "$OUT/flood.json" >"$OUT/flood.out" 2>&1 &
flood=$!; pids+=("$flood")
sleep "$AT"
echo "t=${AT}s: killing redis-server (pid $redis)"; kill -KILL "$redis"; wait "$redis" 2>/dev/null || true
sleep "$DOWN"
echo "t=$((AT + DOWN))s: starting redis-server again on port $RPORT"; start_redis
restarted=$(date +%s.%N)
# When is the node that takes a new connection ready again? /readyz over a
# fresh connection each time (any of the 4 nodes); the timeline below shows
# when sending worked again on all of them.
for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break; sleep 0.05
done
echo "a node answered /readyz 200 $(awk -v a="$restarted" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}') s after the restart"
wait "$flood" || true
python3 - "$OUT/flood.out" "$OUT/flood.json" "$AT" "$DOWN" <<'PY'
import json, re, sys
lines = [l for l in open(sys.argv[1]) if l.strip().startswith("messages: sent")]
# floodtest reports from its own start; rows with 503s are the outage.
prev = (0, 0, 0)
print("second  sent  503s  received   (per second, from floodtest's 1 s reports; a 503 still reaches the streams on the node that took it)")
for i, l in enumerate(lines, 1):
    sent, recv, err = (int(x) for x in re.search(r"sent (\d+) received (\d+) send-errors (\d+)", l).groups())
    mark = "  <- 503s" if err > prev[2] else ""
    print(f"{i:6} {sent - prev[0]:5} {err - prev[2]:5} {recv - prev[1]:9}{mark}")
    prev = (sent, recv, err)
m = json.load(open(sys.argv[2]))["messages"]
print(f"summary: answered 200: {m['sent']}, answered 503: {m['send_errors']} (of them delivered to their stream anyway: {m['send_errors_delivered']}), received: {m['received']}, "
      f"lost (expected = 200s + the 503s' local deliveries, less received): {m['lost']}")
PY
echo "reconnects logged by the nodes:"; grep -c "reconnect=true" "$OUT/fleet.log" || true
echo "output in $OUT"

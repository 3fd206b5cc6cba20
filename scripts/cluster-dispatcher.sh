#!/usr/bin/env bash
# What the Redis round trip costs /dispatcher: `wrk -t1 -cC` against one
# single-process switchboard and one cluster-mode switchboard (its numbers
# from INCRBY in a redis-server this script starts), alternating, same
# build, same run. Checks afterwards that the cluster count is gap-free:
# the next number is (every request wrk completed) + 1. Starts and stops
# only its own processes, by pid.
# Usage: scripts/cluster-dispatcher.sh [SECONDS=10] [ROUNDS=2] [CONNECTIONS=64]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROUNDS=${2:-2}
CONNS=${3:-64}
for v in "$SECS" "$ROUNDS" "$CONNS"; do
  [[ "$v" =~ ^[0-9]+$ && "$v" -ge 1 ]] || { echo "arguments are positive whole numbers: SECONDS ROUNDS CONNECTIONS" >&2; exit 2; }
done
for tool in wrk redis-server; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install -y ${tool/wrk/wrk}" >&2; exit 1; }
done
cargo build --release -q --bin switchboard
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPORT=$(free_port); SPORT=$(free_port); CPORT=$(free_port)
# Two servers: each its own internal listener (server.admin_port 0 picks one).
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >/dev/null &
redis=$!; pids+=("$redis")
SWITCHBOARD__SERVER__PORT=$SPORT SWITCHBOARD__SERVER__ADMIN_PORT=0 SWITCHBOARD__LOG__LEVEL=warn ./target/release/switchboard &
pids+=($!)
SWITCHBOARD__SERVER__PORT=$CPORT SWITCHBOARD__SERVER__ADMIN_PORT=0 SWITCHBOARD__LOG__LEVEL=warn \
  SWITCHBOARD__CLUSTER__REDIS_URL=redis://127.0.0.1:$RPORT SWITCHBOARD__CLUSTER__PREFIX=dispatch \
  ./target/release/switchboard &
pids+=($!)
for port in "$SPORT" "$CPORT"; do
  for _ in $(seq 1 50); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
done
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
tck=$(getconf CLK_TCK)
run() { wrk -t1 -c"$CONNS" -d"${SECS}s" "http://127.0.0.1:$1/dispatcher"; }
sum_s=0; sum_c=0; served=0
for r in $(seq 1 "$ROUNDS"); do
  s=$(run "$SPORT" | awk '/Requests\/sec/ {print $2}')
  before=$(cpu "$redis")
  out=$(run "$CPORT")
  c=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  n=$(echo "$out" | awk '/requests in/ {print $1}')
  served=$((served + n))
  rcpu=$(awk -v a="$before" -v b="$(cpu "$redis")" -v t="$tck" -v s="$SECS" 'BEGIN{printf "%.0f", 100*(b-a)/t/s}')
  echo "round $r: single $s req/s, cluster $c req/s (redis-server CPU ${rcpu}%), cluster/single $(awk -v a="$c" -v b="$s" 'BEGIN{printf "%.2f", a/b}')"
  sum_s=$(awk -v a="$sum_s" -v b="$s" 'BEGIN{print a+b}'); sum_c=$(awk -v a="$sum_c" -v b="$c" 'BEGIN{print a+b}')
done
echo "summed: single $sum_s req/s, cluster $sum_c req/s, cluster/single $(awk -v a="$sum_c" -v b="$sum_s" 'BEGIN{printf "%.2f", a/b}')"
# wrk counts only completed requests; one cut off at the end of a run may
# have had its number taken, so the count may be a little ahead, never behind.
next=$(curl -fs "http://127.0.0.1:$CPORT/dispatcher")
echo "cluster count: wrk completed $served requests; the next number is $next"
[ "$next" -ge $((served + 1)) ] && [ "$next" -le $((served + 1 + CONNS * ROUNDS)) ] || { echo "the count does not match the requests served" >&2; exit 1; }

#!/usr/bin/env bash
# Is loadtest the bottleneck? Measures loadtest against `wrk -t1 -c64` on the
# same switchboard server in the same run, alternating, and prints the ratio
# of req/s. Installs wrk (Debian package) when missing. Starts and stops only
# its own server. Usage: scripts/loadtest-vs-wrk.sh [SECONDS=10] [ROUNDS=2] [CONNECTIONS=64]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROUNDS=${2:-2}
CONNS=${3:-64}
for v in "$SECS" "$ROUNDS" "$CONNS"; do
  [[ "$v" =~ ^[0-9]+$ && "$v" -ge 1 ]] || { echo "arguments are positive whole numbers: SECONDS ROUNDS CONNECTIONS" >&2; exit 2; }
done
if ! command -v wrk >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "wrk is missing; install it (apt-get install wrk) or run as root" >&2; exit 1; }
  apt-get install -y -q wrk >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; }
fi
cargo build --release -q --bin switchboard --bin loadtest
. scripts/lib/serve.sh
start_switchboard SWITCHBOARD__LOG__LEVEL=warn
server=$SERVER_PID
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
URL=http://127.0.0.1:$PORT/dispatcher
sum_l=0; sum_w=0
for r in $(seq 1 "$ROUNDS"); do
  w=$(wrk -t1 -c"$CONNS" -d"${SECS}s" "$URL" | awk '/Requests\/sec/ {print $2}')
  l=$(./target/release/loadtest --url "$URL" --connections "$CONNS" --duration "${SECS}s" | awk '/req\/s/ {print $(NF-1)}')
  [ -n "$w" ] && [ -n "$l" ] || { echo "round $r: a tool printed no req/s (wrk='$w' loadtest='$l')" >&2; exit 1; }
  echo "round $r: wrk $w req/s, loadtest $l req/s, ratio $(awk -v l="$l" -v w="$w" 'BEGIN{printf "%.2f", l/w}')"
  sum_l=$(awk -v a="$sum_l" -v b="$l" 'BEGIN{print a+b}'); sum_w=$(awk -v a="$sum_w" -v b="$w" 'BEGIN{print a+b}')
done
echo "loadtest/wrk over $ROUNDS rounds of ${SECS}s at $CONNS connections: $(awk -v l="$sum_l" -v w="$sum_w" 'BEGIN{printf "%.2f", l/w}')"

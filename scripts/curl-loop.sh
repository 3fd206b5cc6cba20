#!/usr/bin/env bash
# The original's throughput test: LOOPS background shell loops of curl against
# /dispatcher for SECONDS, then requests and req/s from the counter's values.
# Bounded in time (each loop stops at the deadline) and kills only its own
# children. Usage: scripts/curl-loop.sh [LOOPS=30] [SECONDS=300] [URL]
set -euo pipefail
LOOPS=${1:-30}
SECONDS_TO_RUN=${2:-300}
URL=${3:-http://127.0.0.1:8000/dispatcher}
case "$URL" in
  http://127.*|http://localhost*|http://\[::1\]*) ;;
  *) echo "curl-loop: refusing non-loopback target $URL" >&2; exit 2 ;;
esac
[[ "$LOOPS" =~ ^[0-9]+$ && "$LOOPS" -ge 1 && "$LOOPS" -le 1000 ]] || { echo "LOOPS must be 1..1000" >&2; exit 2; }
[[ "$SECONDS_TO_RUN" =~ ^[0-9]+$ && "$SECONDS_TO_RUN" -ge 1 && "$SECONDS_TO_RUN" -le 3600 ]] || {
  echo "SECONDS must be 1..3600" >&2; exit 2; }

before=$(curl -fsS --max-time 5 "$URL") || { echo "curl-loop: $URL not reachable" >&2; exit 1; }
[[ "$before" =~ ^[0-9]+$ ]] || { echo "curl-loop: $URL does not answer a counter (got: $before)" >&2; exit 1; }
start=$(date +%s.%N)
end=$(( $(date +%s%N) + SECONDS_TO_RUN * 1000000000 ))
pids=()
cleanup() {
  local p
  # Freeze each loop so it starts no new curl, end its running curl, then
  # end the loop (any of them may already be gone: never fatal).
  for p in "${pids[@]}"; do
    kill -STOP "$p" 2>/dev/null || true
    pkill -P "$p" 2>/dev/null || true
    kill -TERM "$p" 2>/dev/null || true
    kill -CONT "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  pids=()
}
trap cleanup EXIT
trap 'cleanup; echo "curl-loop: interrupted; no result" >&2; exit 130' INT TERM
for _ in $(seq 1 "$LOOPS"); do
  ( while [ "$(date +%s%N)" -lt "$end" ]; do curl -s -o /dev/null --max-time 5 "$URL"; done ) &
  pids+=($!)
done
wait "${pids[@]}" 2>/dev/null || true
pids=()
stop=$(date +%s.%N)
after=$(curl -fsS --max-time 5 "$URL")
[[ "$after" =~ ^[0-9]+$ ]] || { echo "curl-loop: final read failed (got: $after)" >&2; exit 1; }
# The two reads themselves are requests too: the loops made after - before - 1.
requests=$(( after - before - 1 ))
awk -v n="$requests" -v a="$start" -v b="$stop" -v l="$LOOPS" \
  'BEGIN { t = b - a; printf "curl-loop: %d loops, %.1f s, %d requests, %.1f req/s\n", l, t, n, n / t }'

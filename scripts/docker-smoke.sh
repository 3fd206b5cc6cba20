#!/usr/bin/env bash
# Builds the server image, runs it, and checks from the host that:
#   - GET /dispatcher answers 1 then 2 (Counter actor);
#   - GET /test/smoke streams the welcome line and ticks, and a POST /send
#     reaches it;
#   - the server runs as a non-root user;
#   - `stop` (SIGTERM to PID 1) ends it quickly with exit code 0.
# Usage: scripts/docker-smoke.sh   (CONTAINER_CLI=podman or a wrapper; default docker)
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=${CONTAINER_CLI:-docker}
IMAGE=${IMAGE:-switchboard:smoke}
# A free host port unless one is given: two runs or a busy 18080 must not collide.
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
NAME=switchboard-smoke-$$
URL=http://127.0.0.1:$PORT
fail() { echo "docker-smoke: FAIL: $*" >&2; $CLI logs "$NAME" >&2 || true; exit 1; }

$CLI build -t "$IMAGE" .
$CLI run -d --name "$NAME" -p "127.0.0.1:$PORT:8000" \
  -e SWITCHBOARD__STREAM__TICK_INTERVAL_MS=200 "$IMAGE" >/dev/null
stream_pid=
cleanup() {
  [ -n "$stream_pid" ] && kill "$stream_pid" 2>/dev/null || true
  $CLI rm -f "$NAME" >/dev/null 2>&1 || true
  rm -f "$out"
}
out=$(mktemp)
trap cleanup EXIT

for _ in $(seq 1 100); do
  curl -fsS --max-time 1 "$URL/healthz" >/dev/null 2>&1 && break
  sleep 0.3
done
[ "$(curl -fsS --max-time 5 "$URL/healthz")" = ok ] || fail "/healthz not ok"

[ "$(curl -fsS --max-time 5 "$URL/dispatcher")" = 1 ] || fail "/dispatcher first value is not 1"
[ "$(curl -fsS --max-time 5 "$URL/dispatcher")" = 2 ] || fail "/dispatcher second value is not 2"

curl -sN --max-time 3 "$URL/test/smoke" >"$out" &
stream_pid=$!
sleep 1
delivered=$(curl -fsS --max-time 5 -d 'hello from the host' "$URL/send/smoke")
echo "$delivered" | grep -q '"delivered":1' || fail "/send answered $delivered"
wait "$stream_pid" || true
stream_pid=
grep -q '^Switchboard welcomes you! Your Id: smoke$' "$out" || fail "no welcome line: $(cat "$out")"
grep -q '^Chunk 1 for id smoke$' "$out" || fail "no tick: $(cat "$out")"
grep -q "^Recvd msg #[0-9]*: 'hello from the host'$" "$out" || fail "message not received: $(cat "$out")"

uid=$($CLI exec "$NAME" id -u)
[ "$uid" != 0 ] || fail "server runs as root"

start=$(date +%s)
$CLI stop -t 10 "$NAME" >/dev/null
took=$(( $(date +%s) - start ))
code=$($CLI inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || fail "exit code $code after SIGTERM"
[ "$took" -lt 8 ] || fail "stop took ${took}s: SIGTERM not handled"
echo "docker-smoke: OK (dispatcher, stream + send, non-root uid $uid, SIGTERM exit 0 in ${took}s)"

#!/usr/bin/env bash
# Builds the server image, runs it, and checks from the host that:
#   - GET /dispatcher answers 1 then 2 (Counter actor);
#   - GET /test/smoke streams the welcome line and ticks, and a POST /send
#     with the publish token reaches it (without the token: 401);
#   - /metrics answers on the internal port (9000 in the container) and not
#     on the public one (403);
#   - without a publish token, a /send from the host is refused 403
#     (protected mode: the container sees the host as a non-loopback peer
#     through the port forwarding);
#   - the server runs as a non-root user;
#   - `stop` (SIGTERM to PID 1) ends it quickly with exit code 0.
# Usage: scripts/docker-smoke.sh   (CONTAINER_CLI=podman or a wrapper; default docker)
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=${CONTAINER_CLI:-docker}
IMAGE=${IMAGE:-switchboard:smoke}
# A free host port unless one is given: two runs or a busy 18080 must not collide.
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
ADMIN_PORT=${ADMIN_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
NAME=switchboard-smoke-$$
OPEN_NAME=switchboard-smoke-open-$$
URL=http://127.0.0.1:$PORT
ADMIN_URL=http://127.0.0.1:$ADMIN_PORT
TOKEN=smoke-token-$$
fail() { echo "docker-smoke: FAIL: $*" >&2; $CLI logs "$NAME" >&2 || true; exit 1; }

$CLI build -t "$IMAGE" .
# The internal port is published to the host's loopback only, as an
# operator would.
$CLI run -d --name "$NAME" -p "127.0.0.1:$PORT:8000" -p "127.0.0.1:$ADMIN_PORT:9000" \
  -e SWITCHBOARD__AUTH__PUBLISH_TOKEN="$TOKEN" \
  -e SWITCHBOARD__STREAM__TICK_INTERVAL_MS=200 "$IMAGE" >/dev/null
stream_pid=
cleanup() {
  [ -n "$stream_pid" ] && kill "$stream_pid" 2>/dev/null || true
  $CLI rm -f "$NAME" >/dev/null 2>&1 || true
  $CLI rm -f "$OPEN_NAME" >/dev/null 2>&1 || true
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
code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 -d 'no token' "$URL/send/smoke")
[ "$code" = 401 ] || fail "/send without the token answered $code, not 401"
delivered=$(curl -fsS --max-time 5 -H "Authorization: Bearer $TOKEN" -d 'hello from the host' "$URL/send/smoke")
echo "$delivered" | grep -q '"delivered":1' || fail "/send answered $delivered"
wait "$stream_pid" || true
stream_pid=
grep -q '^Switchboard welcomes you! Your Id: smoke$' "$out" || fail "no welcome line: $(cat "$out")"
grep -q '^Chunk 1 for id smoke$' "$out" || fail "no tick: $(cat "$out")"
grep -q "^Recvd msg #[0-9]*: 'hello from the host'$" "$out" || fail "message not received: $(cat "$out")"

# Prometheus scrapes the internal port; the public one refuses it.
metrics=$(curl -fsS --max-time 5 "$ADMIN_URL/metrics") || fail "/metrics on the internal port"
echo "$metrics" | grep -q '^switchboard_messages_routed_total ' || fail "no routed message in /metrics: $metrics"
code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 "$URL/metrics")
[ "$code" = 403 ] || fail "/metrics on the public port answered $code, not 403"

uid=$($CLI exec "$NAME" id -u)
[ "$uid" != 0 ] || fail "server runs as root"

start=$(date +%s)
$CLI stop -t 10 "$NAME" >/dev/null
took=$(( $(date +%s) - start ))
code=$($CLI inspect -f '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || fail "exit code $code after SIGTERM"
[ "$took" -lt 8 ] || fail "stop took ${took}s: SIGTERM not handled"

# No token: protected mode. The host is not loopback to the container.
$CLI run -d --name "$OPEN_NAME" -p "127.0.0.1:$PORT:8000" "$IMAGE" >/dev/null
for _ in $(seq 1 100); do
  curl -fsS --max-time 1 "$URL/healthz" >/dev/null 2>&1 && break
  sleep 0.3
done
answer=$(curl -sS -w '\n%{http_code}' --max-time 5 -d 'unguarded' "$URL/send/smoke")
[ "${answer##*$'\n'}" = 403 ] || fail "/send without any token answered ${answer##*$'\n'}, not 403: $answer"
echo "$answer" | grep -q 'auth.publish_token' || fail "the 403 does not name auth.publish_token: $answer"
$CLI logs "$OPEN_NAME" 2>&1 | grep -q 'protected mode' || fail "no protected mode line in the log"
$CLI rm -f "$OPEN_NAME" >/dev/null

echo "docker-smoke: OK (dispatcher, stream + send with the token, /metrics on the internal port, protected mode without a token, non-root uid $uid, SIGTERM exit 0 in ${took}s)"

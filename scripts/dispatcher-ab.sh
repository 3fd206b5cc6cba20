#!/usr/bin/env bash
# GET /dispatcher, one build against another in the same run (A/B): for a
# change to the connection path, where `bench dispatcher` (switchboard
# against nginx) only compares builds across runs on this noisy machine.
#
#   scripts/dispatcher-ab.sh BASE_BINARY [NEW_BINARY] [--tls] [--duration S] [--connections C] [--rounds N]
#
# Starts both builds (NEW_BINARY defaults to ./target/release/switchboard)
# side by side on port 0 with 2 workers (with --tls each serves TLS on every
# port, with a certificate made for the run), and runs `wrk -t1 -cC -dS`
# against /dispatcher of one and then the other, the order flipping every
# round, so each pair is back to back. Prints each run's req/s, p99 and the
# server's CPU µs per request (utime + stime from /proc before and after),
# then new ÷ base of the summed req/s and of the CPU per request. Bounded:
# N rounds of 2 runs of S seconds (defaults 3, 64, 10 s: about a minute).
# Stops only the servers it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/dispatcher-ab.sh BASE_BINARY [NEW_BINARY] [--tls] [--duration S] [--connections C] [--rounds N]"
base=${1:?$usage}
shift
new=./target/release/switchboard
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then new=$1; shift; fi
duration=10 connections=64 rounds=3 tls=false
while [ $# -gt 0 ]; do
  case "$1" in
    --tls) tls=true; shift ;;
    --duration) duration=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "unknown option $1; $usage" >&2; exit 2 ;;
  esac
done
for b in "$base" "$new"; do [ -x "$b" ] || { echo "$b: not an executable" >&2; exit 2; }; done
for tool in wrk bc curl openssl; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed: apt-get install -y $tool" >&2; exit 2; }
done

dir=$(mktemp -d)
cleanup() {
  for name in base new; do
    [ -s "$dir/$name.pid" ] && kill "$(cat "$dir/$name.pid")" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

scheme=http
tls_env=()
if $tls; then
  scheme=https
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
  tls_env=(SWITCHBOARD__SERVER__TLS_CERT_FILE="$dir/cert.pem" SWITCHBOARD__SERVER__TLS_KEY_FILE="$dir/key.pem")
fi

# start NAME BINARY: starts it on port 0 (its PID in $dir/NAME.pid), waits
# until it serves, and writes its port to $dir/NAME.port.
start() {
  local file="$dir/$1.addresses"
  env SWITCHBOARD__SERVER__PORT=0 SWITCHBOARD__SERVER__ADMIN_PORT=0 \
    SWITCHBOARD__SERVER__WORKERS=2 SWITCHBOARD__LOG__LEVEL=warn "${tls_env[@]}" \
    SWITCHBOARD__SERVER__ADDRESS_FILE="$file" "$2" >"$dir/$1.log" 2>&1 &
  echo $! >"$dir/$1.pid"
  local _
  for _ in $(seq 1 100); do
    [ -s "$file" ] && break
    sleep 0.1
  done
  [ -s "$file" ] || { echo "$1 ($2) did not serve within 10 s:" >&2; cat "$dir/$1.log" >&2; exit 1; }
  awk '$1 == "public" { n = split($2, a, ":"); print a[n]; exit }' "$file" >"$dir/$1.port"
  curl -sfk "$scheme://127.0.0.1:$(cat "$dir/$1.port")/dispatcher" >/dev/null \
    || { echo "$1: no $scheme /dispatcher" >&2; exit 1; }
}
start base "$base"
start new "$new"

# cpu PID: the process's utime + stime, in clock ticks.
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# run NAME: one wrk run against it; prints "req/s p99 requests ticks".
run() {
  local pid port before after
  pid=$(cat "$dir/$1.pid") port=$(cat "$dir/$1.port")
  before=$(cpu "$pid")
  wrk -t1 -c"$connections" -d"${duration}s" --latency "$scheme://127.0.0.1:$port/dispatcher" >"$dir/wrk.out"
  after=$(cpu "$pid")
  if grep -q "Non-2xx\|Socket errors" "$dir/wrk.out"; then
    echo "$1: wrk saw errors:" >&2
    cat "$dir/wrk.out" >&2
    exit 1
  fi
  echo "$(awk '/^Requests\/sec:/ { print $2 }' "$dir/wrk.out")" \
    "$(awk '$1 == "99%" { print $2 }' "$dir/wrk.out")" \
    "$(awk '/requests in/ { print $1 }' "$dir/wrk.out")" \
    "$((after - before))"
}

hz=$(getconf CLK_TCK)
echo "| round | build | req/s | p99 | CPU µs/req |"
echo "| ---: | --- | ---: | ---: | ---: |"
declare -A rps_sum=([base]=0 [new]=0) req_sum=([base]=0 [new]=0) tick_sum=([base]=0 [new]=0)
for r in $(seq 1 "$rounds"); do
  order="base new"
  [ $((r % 2)) -eq 0 ] && order="new base"
  for name in $order; do
    read -r rps p99 requests ticks < <(run "$name")
    us=$(echo "scale=2; $ticks * 1000000 / $hz / $requests" | bc)
    echo "| $r | $name | $rps | $p99 | $us |"
    rps_sum[$name]=$(echo "${rps_sum[$name]} + $rps" | bc)
    req_sum[$name]=$((req_sum[$name] + requests))
    tick_sum[$name]=$((tick_sum[$name] + ticks))
  done
done
echo
ratio_rps=$(echo "scale=2; ${rps_sum[new]} / ${rps_sum[base]}" | bc)
ratio_cpu=$(echo "scale=2; (${tick_sum[new]} * ${req_sum[base]}) / (${tick_sum[base]} * ${req_sum[new]})" | bc)
echo "wrk -t1 -c$connections -d${duration}s $scheme://, $rounds rounds: req/s summed base ${rps_sum[base]}," \
  "new ${rps_sum[new]}, new ÷ base = $ratio_rps; CPU per request new ÷ base = $ratio_cpu"

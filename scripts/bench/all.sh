#!/usr/bin/env bash
# Runs every switchboard benchmark, then regenerates BENCHMARKS.md and the
# charts in docs/ from the results. About 8 minutes on a 2-core machine for
# the six short ones (plus up to a minute waiting for old TIME_WAIT sockets
# to expire), then the 30-minute soak. Each benchmark starts its own servers
# on free loopback ports, is bounded in time, and stops only the processes it
# started.
#
#   scripts/bench/all.sh            results in bench/results/, report in BENCHMARKS.md
#   scripts/bench/all.sh --smoke    tiny counts and a 2-minute soak, about 5 minutes; results AND
#                                   report go to a temporary directory (BENCHMARKS.md is not touched)
#
# One benchmark alone: target/release/bench <idle|dispatcher|latency|broadcast|flood|connect|cluster|soak> [--help].
# bench flood --baseline PATH also measures another switchboard binary (the previous build) in the same run.
set -euo pipefail
cd "$(dirname "$0")/../.."

smoke=()
case "${1:-}" in
  "") ;;
  --smoke) smoke=(--smoke) ;;
  *) echo "usage: scripts/bench/all.sh [--smoke]" >&2; exit 2 ;;
esac

scripts/bench/peers.sh
cargo build --release -q --bins
bench=./target/release/bench

if [ ${#smoke[@]} -gt 0 ]; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/switchboard-bench-smoke.XXXXXX")
  results=$dir/results
  report=$dir
else
  results=bench/results
  report=.
fi

started=$SECONDS
for b in idle dispatcher latency broadcast flood connect cluster soak; do
  echo "== bench $b ${smoke[*]}"
  "$bench" "$b" --out "$results" "${smoke[@]}"
done
echo "== bench report"
"$bench" report --results "$results" --out "$report"
echo "all.sh: done in $((SECONDS - started)) s; results in $results, report $report/BENCHMARKS.md"

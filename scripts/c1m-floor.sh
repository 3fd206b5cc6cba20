#!/usr/bin/env bash
# The floor of a broadcast to a million streams on this box: bench-floor
# processes (one write(2) per stream, nothing else) in place of switchboard,
# the same clients as scripts/c1m.sh; see scripts/c1m-floor.py.
# Usage: scripts/c1m-floor.sh [--streams N] [--rate 10000] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p switchboard-bench --bin bench-floor
cargo build --release -q --bin floodtest
exec python3 scripts/c1m-floor.py "$@"

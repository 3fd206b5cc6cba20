#!/usr/bin/env bash
# A million concurrent streams on this box, routed through the cluster bus:
# builds the release binaries and runs scripts/c1m.py (see its docstring).
# Usage: scripts/c1m.sh [--streams N] [--hold 180s] [--msg-rate 1000] [--rate 10000] [--tick-interval 60s]
#                       [--processes P] [--max-minutes 15] [--json FILE] [--redis-cluster]
# Exit 0: every target met; 3: the run did what it should (streams held,
# nothing lost, broadcast received, clean drain) but a figure missed its
# target; 1: it did not.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server" >&2; exit 1; }
cargo build --release -q --bin switchboard --bin floodtest
exec python3 scripts/c1m.py "$@"

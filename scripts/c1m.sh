#!/usr/bin/env bash
# A million concurrent streams on this box, routed through the cluster bus:
# builds the release binaries and runs scripts/c1m.py (see its docstring).
# Usage: scripts/c1m.sh [--streams N] [--hold 180s] [--msg-rate 1000] [--json FILE] [--processes P]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install -y redis-server" >&2; exit 1; }
cargo build --release -q --bin switchboard --bin floodtest
exec python3 scripts/c1m.py "$@"

#!/usr/bin/env bash
# What the edge costs (issue 26): bytes per idle stream and connect rate with
# server.proxy_protocol = "v2" (proxy), and with it every [limits] on, nothing
# exempt (edge), against both off, alternated in the same run (see
# scripts/edge-cost.py).
# Usage: scripts/edge-cost.sh [--count 19000] [--rate 5000] [--rounds 2] [--setups off,proxy,edge] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q --bin switchboard --bin floodtest
exec python3 scripts/edge-cost.py "$@"

#!/usr/bin/env bash
# Native TLS against HAProxy terminating TLS in front of plain switchboard
# (issue 27): bytes per idle stream, all server processes counted, against
# plain streams, alternated in the same run (see scripts/tls-terminator-cost.py).
# Needs haproxy and openssl (apt-get install -y haproxy openssl).
# Usage: scripts/tls-terminator-cost.sh [--count 9000] [--rate 2000] [--rounds 2] [--setups plain,native,haproxy]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q --bin switchboard --bin floodtest
exec python3 scripts/tls-terminator-cost.py "$@"

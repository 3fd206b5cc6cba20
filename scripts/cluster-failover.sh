#!/usr/bin/env bash
# A Redis Sentinel failover under load: builds the release binaries and runs
# scripts/cluster-failover.py (see its docstring): a master, its replicas and
# three sentinels; `switchboard --processes 4` plus a probe node; floodtest
# with 10,000 streams and 1,000 msg/s; SIGKILL of the master (--fault stop:
# SIGSTOP, then SIGCONT once a replica is promoted; --fault none: no fault,
# for the cost of --wait-replicas; --tls: everything over TLS). Prints the result as JSON; exit 0 when
# nothing answered 200 was lost and cross-node delivery came back.
# Usage: scripts/cluster-failover.sh [--fault kill|stop|none] [--replicas 1] [--wait-replicas 0] [--tls] [--processes 4] [--streams 10000]
#                                    [--msg-rate 1000] [--fault-at 10] [--after 20] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
for c in redis-server redis-cli openssl; do
  command -v "$c" >/dev/null || { echo "$c is missing: apt-get install -y redis-server" >&2; exit 1; }
done
cargo build --release -q --bin switchboard --bin floodtest
exec python3 scripts/cluster-failover.py "$@"

#!/usr/bin/env bash
# Kernel and process limits that decide how many connections one machine holds.
# By default only prints each setting with its current and recommended value for
# N connections (client and server both on this machine count twice).
#   scripts/tune-kernel.sh [--connections N] [--apply]
# --apply (root) sets every sysctl that is below its recommendation, then says
# exactly which ones it set and which it could not; it exits non-zero if any
# failed, so a half-applied tuning never passes silently. Per-process fd limits
# (ulimit -n) cannot be raised past the hard limit by a script: it explains them.
set -uo pipefail
N=100000
APPLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --connections) N=${2:?}; shift 2 ;;
    --apply) APPLY=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$N" =~ ^[0-9]+$ && "$N" -ge 1 ]] || { echo "--connections takes a positive number" >&2; exit 2; }

SOCKETS=$((2 * N))            # a client and a server end per connection on one machine
soft=$(ulimit -Sn); hard=$(ulimit -Hn)
per_proc=$(( hard > 1100 ? hard - 1000 : hard / 2 ))
procs=$(( (N + per_proc - 1) / per_proc ))

printf '%-34s %-26s %-26s %s\n' SETTING CURRENT RECOMMENDED NOTE
row() { printf '%-34s %-26s %-26s %s\n' "$1" "$2" "$3" "$4"; }
row "ulimit -n (soft/hard)" "$soft/$hard" ">= $((N + 1024)) per process" \
  "hard limit caps one process at ~$per_proc sockets: N=$N needs $procs process(es) on each side (floodtest splits itself; the server side is switchboard --processes $procs with cluster.redis_url set, one port for all)"

failed=(); applied=(); advisory=()
check() { # key recommended-value compare-mode(min|min3|exact) note [advisory]
  local key=$1 want=$2 mode=$3 note=$4 soft=${5:-} path cur ok=1
  path=/proc/sys/${key//./\/}
  if [ ! -r "$path" ]; then row "$key" "(absent)" "$want" "$note; not present on this kernel"; return; fi
  cur=$(tr -s '\t ' ' ' <"$path")
  case $mode in
    min) [ "$cur" -ge "$want" ] 2>/dev/null || ok=0 ;;
    min3) read -r a b c <<<"$cur"; read -r x y z <<<"$want"; { [ "$a" -ge "$x" ] && [ "$b" -ge "$y" ] && [ "$c" -ge "$z" ]; } || ok=0 ;;
    range) read -r a b <<<"$cur"; read -r x y <<<"$want"; { [ "$a" -le "$x" ] && [ "$b" -ge "$y" ]; } || ok=0 ;;
  esac
  row "$key" "$cur" "$want" "$note$([ $ok = 1 ] && echo ' [ok]')"
  if [ $APPLY = 1 ] && [ $ok = 0 ]; then
    local new=$want   # never lower any part of a setting that is already higher
    case $mode in
      min3) new="$(( a > x ? a : x )) $(( b > y ? b : y )) $(( c > z ? c : z ))" ;;
      range) new="$(( a < x ? a : x )) $(( b > y ? b : y ))" ;;
    esac
    if printf '%s\n' "$new" 2>/dev/null >"$path"; then applied+=("$key=$new")
    elif [ -n "$soft" ]; then advisory+=("$key")
    else failed+=("$key"); fi
  fi
}
check fs.file-max $((SOCKETS + 100000)) min "all open files on the machine"
check fs.nr_open $((N + 1024)) min "ceiling for any process's ulimit -n"
check net.ipv4.ip_local_port_range "1024 65535" range "ephemeral ports per (source, destination) pair; also spread over source IPs (floodtest --source-ips). Put server ports in net.ipv4.ip_local_reserved_ports (e.g. 8000-8099) so no client takes them"
check net.ipv4.tcp_mem "$((SOCKETS)) $((SOCKETS * 2)) $((SOCKETS * 3))" min3 "pages for all TCP buffers (~1-2 pages per idle socket)"
check net.ipv4.tcp_rmem "4096 16384 16777216" min3 "per-socket receive buffer min/default/max"
check net.ipv4.tcp_wmem "4096 16384 16777216" min3 "per-socket send buffer min/default/max"
check net.core.somaxconn 4096 min "caps the listen backlog (server.backlog)"
check net.ipv4.tcp_max_syn_backlog 4096 min "half-open connections queued during a connect burst"
check net.netfilter.nf_conntrack_max $((SOCKETS + 65536)) min "only matters if conntrack tracks these flows"
# Every packet looks its flow up in conntrack's hash, and each connection is
# two entries: with far more entries than buckets, each lookup walks a chain
# of cold cache lines (at 1,000,000 streams with the default 262,144 buckets,
# __nf_conntrack_find_get was 12% of the servers' CPU during a broadcast).
buckets=1; while [ $buckets -lt $SOCKETS ]; do buckets=$((buckets * 2)); done
check net.netfilter.nf_conntrack_buckets $buckets min "conntrack hash buckets, one per entry (only matters if conntrack tracks these flows)" advisory
# TCP's own hash of established sockets is sized at boot and read-only here;
# __inet_lookup_established walks its chains for every packet the same way.
ehash_path=/proc/sys/net/ipv4/tcp_ehash_entries
if [ -r $ehash_path ]; then
  ehash=$(cat $ehash_path); ehash=${ehash#-}
  row net.ipv4.tcp_ehash_entries "$ehash" ">= $buckets" "established-socket hash buckets; read-only: set at boot (thash_entries=$buckets)$([ "$ehash" -ge "$buckets" ] && echo ' [ok]')"
fi

if [ $APPLY = 1 ]; then
  echo
  [ ${#applied[@]} -gt 0 ] && printf 'applied: %s\n' "${applied[@]}"
  # Speed, not capacity: one that cannot be set here (read-only in a
  # container) slows lookups but refuses nothing, so it does not fail.
  [ ${#advisory[@]} -gt 0 ] && printf 'advisory, not set (read-only here?): %s\n' "${advisory[@]}"
  if [ ${#failed[@]} -gt 0 ]; then
    printf 'COULD NOT SET (not root, read-only /proc/sys, or refused by the kernel): %s\n' "${failed[@]}"
    echo "The machine is partly tuned: the settings above marked without [ok] still limit it."
    exit 1
  fi
  [ ${#applied[@]} -eq 0 ] && [ ${#advisory[@]} -eq 0 ] && echo "nothing to apply: every sysctl already meets the recommendation"
  echo "ulimit -n is per process: raise it where the server starts (systemd LimitNOFILE, docker --ulimit nofile=...)."
fi
exit 0

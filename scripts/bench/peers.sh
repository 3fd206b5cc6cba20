#!/usr/bin/env bash
# Installs the benchmark peers from Debian packages when they are missing:
# nginx with the Nchan module (libnginx-mod-nchan), wrk, and redis-server
# (bench cluster starts its own). Does nothing when they are all installed.
# The packages' postinst would start an nginx service on port 80 and a Redis
# on 6379; a policy-rc.d that forbids service starts is put in place for the
# install (only if none exists, and removed afterwards; an existing one is left
# alone). Usage: scripts/bench/peers.sh
set -euo pipefail

NCHAN_MODULE=/usr/lib/nginx/modules/ngx_nchan_module.so
POLICY=/usr/sbin/policy-rc.d

missing=()
installed() { [ "$(dpkg-query -W -f '${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
installed nginx || missing+=(nginx)
{ installed libnginx-mod-nchan && [ -f "$NCHAN_MODULE" ]; } || missing+=(libnginx-mod-nchan)
{ installed wrk && command -v wrk >/dev/null; } || missing+=(wrk)
{ installed redis-server && command -v redis-server >/dev/null; } || missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] && exit 0

[ "$(id -u)" = 0 ] || { echo "peers.sh: missing ${missing[*]}; run as root to apt-get install them" >&2; exit 1; }
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$POLICY"
  chmod 755 "$POLICY"
  trap 'rm -f "$POLICY"' EXIT
fi
echo "peers.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
[ -f "$NCHAN_MODULE" ] || { echo "peers.sh: $NCHAN_MODULE still missing after the install" >&2; exit 1; }

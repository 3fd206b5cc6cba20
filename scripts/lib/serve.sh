# Sourced by scripts that start their own switchboard (bash).
#
# start_switchboard [VAR=value ...]: starts ./target/release/switchboard in
# the background on port 0 and admin port 0 (the kernel picks both, so no
# other process can take them between a pick and the bind), with the given
# settings on top, and waits until it serves. Sets SERVER_PID, PORT (the
# public port) and ADMIN_PORT (the internal listener: /stats, /metrics) from
# the server's server.address_file. Returns 1 if it exited or did not serve
# within 10 s. The caller stops it: kill "$SERVER_PID".
start_switchboard() {
  local file
  file=$(mktemp -u "${TMPDIR:-/tmp}/switchboard-addresses.XXXXXX")
  env SWITCHBOARD__SERVER__PORT=0 SWITCHBOARD__SERVER__ADMIN_PORT=0 \
    SWITCHBOARD__SERVER__ADDRESS_FILE="$file" "$@" ./target/release/switchboard &
  SERVER_PID=$!
  local _
  for _ in $(seq 1 100); do
    [ -s "$file" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "switchboard exited before it served" >&2; return 1; }
    sleep 0.1
  done
  [ -s "$file" ] || { echo "switchboard did not serve within 10 s" >&2; return 1; }
  PORT=$(awk '$1 == "public" { n = split($2, a, ":"); print a[n]; exit }' "$file")
  ADMIN_PORT=$(awk '$1 == "admin" { n = split($2, a, ":"); print a[n]; exit }' "$file")
  rm -f "$file"
}

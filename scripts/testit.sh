#!/usr/bin/env bash
# One request to /dispatcher, as in the original experiment.
# Usage: scripts/testit.sh [URL]   (default http://127.0.0.1:8000/dispatcher)
set -euo pipefail
URL=${1:-http://127.0.0.1:8000/dispatcher}
curl -fsS --max-time 5 "$URL"
echo

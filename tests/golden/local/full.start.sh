#!/usr/bin/env bash
# Starts the head of the local cluster "golden-full".
# Rendered by infra/providers/local/provider.py (Provider._start_script); `invoke up` runs it.
set -euo pipefail

# Usage statistics stay off unless the user opted in; rayfleet never phones home by default.
export RAY_USAGE_STATS_ENABLED=0

# The cluster's own address for every process Ray starts: Ray's tools inside jobs and actors (the
# state API, e.g. Ray Train's placement group cleaner) otherwise look for "the" Ray on this machine
# and fail when another cluster runs here too.
export RAY_ADDRESS=127.0.0.1:23000

# Token authentication: every request to the dashboard, job API and GCS must carry the cluster's
# token, which Ray reads from a 0600 file (the path is here, never the token).
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN_PATH=<rayfleet-home>/keys/golden-full/ray-token

# A job's `python` is the Python that runs this Ray (with Ray in it), whatever the PATH of the
# shell that ran `up`: a job's entrypoint, and the gateway's reaper, find it first.
export PATH=<ray-bin>:"$PATH"

# Every port comes from this cluster's own block and the temp dir ($1: `up` creates it inside a
# fresh 0700 folder) is private, so a Ray that the user started by hand on the default ports (and
# its temp dir /tmp/ray) is never disturbed.
temp_dir=${1:?usage: start.sh TEMP_DIR}
# Temporary files of every process Ray starts here (Python multiprocessing's pymp-* folders, a
# job's tempfile) go inside this cluster's private parent folder, which `teardown` removes whole:
# none of them is left behind in /tmp.
export TMPDIR="${temp_dir%/*}/tmp"
mkdir -p -m 700 "$TMPDIR"
flags=(
  --head
  --dashboard-host=127.0.0.1
  --port=23000
  --dashboard-port=23001
  --ray-client-server-port=23002
  --node-manager-port=23003
  --object-manager-port=23004
  --dashboard-agent-listen-port=23005
  --dashboard-agent-grpc-port=23006
  --metrics-export-port=23007
  --runtime-env-agent-port=23008
  --min-worker-port=23016
  --max-worker-port=23115
  --temp-dir="$temp_dir"
  --num-cpus=4
  --num-gpus=1
  --object-store-memory=209715200
  --resources='{"special": 2.0, "we ird": 0.5}'
  --disable-usage-stats
  --log-style=record
)
# Ray's own `ray start` as the cloud nodes run it, as this user (`-u -`): setup/users/ray.sh
# loads Ray's CLI without the command groups a start never uses (infra/node/raycli.py).
exec bash <setup>/users/ray.sh -u - start "${flags[@]}"

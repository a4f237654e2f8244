#!/usr/bin/env bash
# rayfleet, Google TPU VMs: what Ray's `ray start` reads from the metadata server, as Ray's own
# environment variables, for a Ray that runs as a user the metadata server does not answer.
#
#   sudo bash gcp_tpu_env.sh > FILE   (then `. FILE` before `ray start`)
#
# Prints `export NAME=value` lines (shell-quoted) for the attributes this VM has: none on a Compute
# VM, four on a TPU host. Run by a user guard.sh lets through (root, the SSH user). Ray
# (ray/_private/accelerators/tpu.py, 2.60) reads each variable first and asks the metadata
# server only when it is unset:
#   TPU_ACCELERATOR_TYPE <- instance/attributes/accelerator-type   (e.g. v4-8)
#   TPU_NAME             <- instance/attributes/instance-id         (the TPU node's name)
#   TPU_WORKER_ID        <- instance/attributes/agent-worker-number (the host's index in the slice)
#   TPU_TOPOLOGY         <- TOPOLOGY: '...' in instance/attributes/tpu-env
set -Eeuo pipefail

readonly BASE=http://metadata.google.internal/computeMetadata/v1/instance/attributes

attribute() {
  # -f: a 404 (no such attribute: not a TPU host) prints nothing.
  curl -sf --max-time 5 -H 'Metadata-Flavor: Google' "$BASE/$1" || true
}

emit() {
  [ -n "$2" ] || return 0
  printf 'export %s=%q\n' "$1" "$2"
}

emit TPU_ACCELERATOR_TYPE "$(attribute accelerator-type)"
emit TPU_NAME "$(attribute instance-id)"
emit TPU_WORKER_ID "$(attribute agent-worker-number)"
emit TPU_TOPOLOGY "$(attribute tpu-env | sed -n "s/^TOPOLOGY: *'\([^']*\)'.*/\1/p" | head -n 1)"

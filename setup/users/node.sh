#!/usr/bin/env bash
# rayfleet: Ray's start on a cloud node, as the cluster's node.conf beside this script says.
#
#   bash node.sh head | worker
#
# Run by the node's SSH user (Ray's updater, `up` over SSH, GCP's slice joiner). node.conf is
# rendered on the laptop (infra/core/node_start.py, templates/node.conf.j2) and shipped with
# these scripts; no secret is in it (the token and the tracking password are read from their
# 0600 files by Ray's user's shell when Ray starts). In this order:
#   1. the SSH user's private files kept private (`private`);
#   2. the node's users made and handed their files (users.sh with ROLE_files; ROLE_moved go);
#   3. the addresses only root and the autoscaler's user may open guarded (guard.sh, `guard`);
#   4. a Ray that Ray's user still runs stopped (the node env activated first);
#   5. Ray's TPU attributes read as root into Ray's user's home (`tpu_env`, workers);
#   6. `ray start ROLE_flags` as Ray's user, ROLE_env run by its shell first: ray.sh, read into
#      this same process (no process more on a worker's way to joining).
set -Eeuo pipefail

here=${BASH_SOURCE[0]%/*}
case $here in /*) ;; *) here=$PWD/$here ;; esac
role=${1:-}
case $role in
  head | worker) ;;
  *) printf 'node.sh: expected head or worker, got %s\n' "'$role'" >&2; exit 2 ;;
esac
[ -r "$here/node.conf" ] || { echo "node.sh: no $here/node.conf (rendered by up)" >&2; exit 2; }
# shellcheck disable=SC2034  # (node.conf sets them; ROLE_moved is read through `moved`)
private="" activate="" tpu_env="" guard=() head_moved=() worker_moved=()
# (A worker's flags name RAY_HEAD_IP, which Ray's launcher sets for workers only.)
set +u
# shellcheck source=/dev/null
. "$here/node.conf"
set -u
declare -n files=${role}_files env=${role}_env flags=${role}_flags moved=${role}_moved

sudo=()
[ "$EUID" = 0 ] || sudo=(sudo -n)
# The folder that holds rayfleet/users (the SSH user's home, or a worker kit in it).
source_home=${here%/rayfleet/users}

[ -z "$private" ] || chmod -R go-rwx "$source_home/$private" 2>/dev/null || true
"${sudo[@]}" bash "$here/users.sh" "$source_home" "${files[@]}"
for path in "${moved[@]}"; do rm -f "$source_home/$path"; done
[ ${#guard[@]} -eq 0 ] || "${sudo[@]}" bash "$here/guard.sh" "${guard[@]}"
# `ray stop` imports Ray (seconds of CPU): only when Ray's user runs anything (never on a new node).
# shellcheck source=/dev/null
[ -z "$activate" ] || . "$activate"
if pgrep -u rayfleet-ray >/dev/null 2>&1; then bash "$here/ray.sh" stop; fi
if [ "$role" = worker ] && [ -n "$tpu_env" ]; then
  "${sudo[@]}" bash "$here/gcp_tpu_env.sh" | bash "$here/ray.sh" sh "cat > ${tpu_env@Q}"
fi

set -- -e "${env[*]}" start "${flags[@]}"
# shellcheck source=/dev/null
. "$here/ray.sh"

#!/usr/bin/env bash
# rayfleet: Ray's command line on a cloud node, run as Ray's user (infra/core/privilege.py).
#
#   bash ray.sh [-u USER] [-e WORDS] start ARGS...   `ray start ARGS` as USER
#   bash ray.sh [-u USER] stop                       `ray stop` as USER, if USER runs anything
#   bash ray.sh [-u USER] sh COMMAND                 a shell command as USER, in its home
#
# Cloud nodes reach it through node.sh (their start, as the cluster's node.conf says); local `up`
# runs `ray.sh -u - start ...` (its start.sh), so raycli's program below is in one place.
# Run as the node's SSH user (after the node env's activation put Ray on PATH), or as root.
# USER is rayfleet-ray unless given; `-u -` runs as the caller (no switch). WORDS are rayfleet's
# own shell words run by USER's shell before `ray` (`VAR=value ` words, `$HOME` = USER's home,
# a password read there from its 0600 file: on no command line).
#
# The switch keeps PATH, and the variables Ray's launcher exports to the start commands it runs
# (sudo resets the environment; the Ray-documented knobs ride along, so a cluster tuned by them
# stays tuned), each only when set.
#
# Which `ray`: the Python that the `ray` on PATH names in its first line (pip writes the Python
# Ray was installed into there: a venv, `pip --user`, the system's) runs Ray's CLI through
# raycli (infra/node/raycli.py, the program below: without the command groups a start never
# uses, where that is proven for the Ray at hand). When that line names no Python, the `ray`
# script itself runs, and one line on stderr says so.
set -Eeuo pipefail

readonly PASSED_ON="RAY_HEAD_IP RAY_OVERRIDE_RESOURCES RAY_OVERRIDE_LABELS RAY_CLOUD_INSTANCE_ID
RAY_NODE_TYPE_NAME RAY_enable_autoscaler_v2 RAY_USAGE_STATS_ENABLED AUTOSCALER_UPDATE_INTERVAL_S
RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"

die() { printf 'ray.sh: %s\n' "$*" >&2; exit 2; }

# infra/node/raycli.py RUN, verbatim (tests/node/test_raycli.py checks it is).
read -r -d '' RAYCLI <<'PY' || true
import sys
import ray
rf_skip = [n for n in ("ray.serve.scripts", "ray.util.state.state_cli", "ray.dashboard.modules.job.cli") if n not in sys.modules]
if ray.__version__ != "2.60.0":
    rf_skip = []
    print("rayfleet: plain ray: Ray " + ray.__version__ + " here, raycli is proven with 2.60.0",
          file=sys.stderr)
sys.modules.update(dict.fromkeys(rf_skip))
from ray.scripts.scripts import main
[sys.modules.pop(n) for n in rf_skip if sys.modules.get(n, 0) is None]
sys.argv[0] = "ray"
sys.exit(main())
PY

# The Python the `ray` script at $1 runs with (its first line; `env NAME` looked up on PATH;
# pip's `#!/bin/sh` launcher for long paths, its `exec` line), or nothing.
interpreter() {
  local first second python="" shebang
  { IFS= read -r first || true; IFS= read -r second || true; } < "$1" 2>/dev/null || return 0
  case $first in
    '#!/bin/sh') [[ $second == "'''exec' \""* ]] && python=${second#*\"} && python=${python%%\"*} ;;
    '#!'*)
      read -r -a shebang <<< "${first#'#!'}"
      python=${shebang[0]:-}
      [ "${python##*/}" = env ] && python=$(command -v "${shebang[1]:-}" || true) ;;
  esac
  case ${python##*/} in python*) [ -x "$python" ] && printf '%s\n' "$python" ;; esac
  return 0
}

# Ray's CLI with ARGS, as this user (WORDS first).
run_ray() {
  local words=$1 ray python
  shift
  ray=$(command -v ray) || { echo "ray.sh: no ray on PATH ($PATH)" >&2; return 127; }
  python=$(interpreter "$ray")
  if [ -n "$python" ]; then
    set -- "$python" -c "$RAYCLI" "$@"
  else
    set -- "$ray" "$@"
    echo "rayfleet: plain ray: the first line of $ray names no Python to run raycli with" >&2
  fi
  unset RAYCLI  # (not in the environment of every process Ray starts)
  eval "$words"' exec "$@"'
}

# The part that runs as Ray's user, from its home (the caller's own, `-u -`, stays where it is:
# local `up` starts its head through this script).
as_user() {
  [ "$user" = - ] || cd ~ || return 1
  local words=$1
  shift
  case $1 in
    sh) eval "$2" ;;
    stop) (run_ray "" stop) >/dev/null 2>&1 || true ;;
    start) shift; run_ray "$words" start "$@" ;;
  esac
}

user=rayfleet-ray
words=""
while getopts u:e: opt; do
  case $opt in
    u) user=$OPTARG ;;
    e) words=$OPTARG ;;
    *) die "usage: ray.sh [-u USER] [-e WORDS] start ARGS... | stop | sh COMMAND" ;;
  esac
done
shift $((OPTIND - 1))
case ${1:-} in
  start) ;;
  stop) [ "$user" = - ] || pgrep -u "$user" >/dev/null 2>&1 || exit 0 ;;
  sh) [ $# -eq 2 ] || die "sh takes one COMMAND" ;;
  *) die "unknown command '${1:-}': expected start, stop or sh" ;;
esac
if [ "$user" = - ]; then
  as_user "$words" "$@"
  exit
fi

passed=()
for name in $PASSED_ON; do
  [ -z "${!name+set}" ] || passed+=("$name=${!name}")
done
sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo -n)
# Ray's user runs these functions (it may not read this file: it is in the SSH user's home).
exec "${sudo[@]}" runuser -u "$user" -- env PATH="$PATH" "${passed[@]}" RAYCLI="$RAYCLI" \
  bash -c "user=${user@Q}; $(declare -f interpreter run_ray as_user); as_user \"\$@\"" ray.sh \
  "$words" "$@"

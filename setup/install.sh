#!/usr/bin/env bash
# rayfleet node installer: puts the project's Ray environment on this node.
#
#   bash setup/install.sh --env cpu|gpu|tpu|auto --ray-version V --python-version X.Y
#                         [--backend auto|conda|venv] [--prefix DIR] [--log FILE]
#                         [--python PATH] [--isolated] [--lock-timeout SECONDS] [--metrics]
#                         [--metrics-from any|conda-forge]
#   bash setup/install.sh --detect          # print the accelerator: cpu, gpu or tpu
#
# Callers (cluster templates, the Slurm batch script) take the pins from infra/core/versions.py, so every
# node runs the Ray and Python minor of the machine that ran `invoke up`.
#
# Backends: conda (conda or mamba on PATH or in a usual place; Miniforge is installed when neither
# exists and no Python X.Y is at hand) and venv (python -m venv + pip, for machines without conda
# and for tests). `auto` prefers conda when present, then a venv from an existing Python X.Y, then
# Miniforge.
#
# Idempotent and safe to run concurrently: a lock (flock) serialises runs on one prefix, and a
# marker in the prefix records the pins and the env spec; a second run checks the env and exits in
# well under a second. Progress goes to stderr and the log file, results to stdout; any failure
# exits non-zero with one line saying what failed and the tail of the log.
#
# --metrics (a head of a `metrics: prometheus` cluster) also installs Prometheus unless one is on
# PATH or in the env: the distribution's package where apt-get can (root or passwordless sudo; its
# own service stopped again), else conda-forge's into the env; where neither can, one line says so
# and the install goes on (the cluster then runs without metrics). --metrics-from conda-forge
# skips the distribution's package: a Slurm login host's apt-get would install it on the login
# host, not into the env the compute nodes share.
#
# Test hooks: RAYFLEET_SYSROOT prefixes the device paths that detection reads (/dev/nvidia0,
# /dev/accel0, /dev/vfio, /sys/bus/pci), RAYFLEET_MINIFORGE_URL and RAYFLEET_MINIFORGE_DIR move
# Miniforge.
set -Eeuo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly MARKER=.rayfleet-env
readonly PARTIAL=.rayfleet-partial

ENV_KIND=auto
RAY_VERSION=""
PYTHON_VERSION=""
BACKEND=auto
PREFIX=""
LOG=""
PYTHON_BIN=""
ISOLATED=0
METRICS=0
METRICS_FROM=any
LOCK_TIMEOUT=1800
DETECT_ONLY=0
SPEC_DIGEST=""
CONDA=""
# Temporary files, removed on exit whatever happens.
CLEANUP=()
trap 'rm -f -- "${CLEANUP[@]}"' EXIT
STARTED=$(date +%s.%N)

# ---------------------------------------------------------------- logging and errors

log() {
  local line
  line="$(date +%H:%M:%S) install.sh: $*"
  printf '%s\n' "$line" >&2
  if [[ -n "$LOG" ]]; then printf '%s\n' "$line" >>"$LOG"; fi
}

die() {
  local code=${2:-1}
  printf 'install.sh: error: %s\n' "$1" >&2
  if [[ -n "$LOG" ]]; then printf '%s install.sh: error: %s\n' "$(date +%H:%M:%S)" "$1" >>"$LOG"; fi
  exit "$code"
}

usage_error() {
  die "$1 (see: bash setup/install.sh --help)" 2
}

# Exits with a one-line message followed by the tail of the log, where commands' output went.
fail() {
  trap - ERR
  printf 'install.sh: error: %s\n' "$1" >&2
  if [[ -n "$LOG" && -f "$LOG" ]]; then
    printf '%s install.sh: error: %s\n' "$(date +%H:%M:%S)" "$1" >>"$LOG"
    printf 'install.sh: last lines of %s:\n' "$LOG" >&2
    tail -n 15 "$LOG" | sed 's/^/    /' >&2
  fi
  exit "${2:-1}"
}

# A command whose output goes to the log; returns its status (for `if` and `||`).
try() {
  local shown=${*//$'\n'/ }
  log "+ ${shown:0:160}"
  "$@" >>"$LOG" 2>&1
}

# A command that must succeed.
run() {
  local code=0 shown=${*//$'\n'/ }
  try "$@" || code=$?
  ((code == 0)) || fail "'${shown:0:160}' failed with exit code $code" "$code"
}

on_error() {
  fail "'$3' failed with exit code $1 (install.sh line $2)" "$1"
}
trap 'on_error $? $LINENO "$BASH_COMMAND"' ERR

elapsed() {
  awk -v a="$STARTED" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'
}

# ---------------------------------------------------------------- arguments

usage() {
  sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

parse_args() {
  while (($#)); do
    case "$1" in
      --env) ENV_KIND=${2:-}; shift ;;
      --ray-version) RAY_VERSION=${2:-}; shift ;;
      --python-version) PYTHON_VERSION=${2:-}; shift ;;
      --backend) BACKEND=${2:-}; shift ;;
      --prefix) PREFIX=${2:-}; shift ;;
      --log) LOG=${2:-}; shift ;;
      --python) PYTHON_BIN=${2:-}; shift ;;
      --isolated) ISOLATED=1 ;;
      --metrics) METRICS=1 ;;
      --metrics-from) METRICS_FROM=${2:-}; shift ;;
      --lock-timeout) LOCK_TIMEOUT=${2:-}; shift ;;
      --detect) DETECT_ONLY=1 ;;
      -h | --help) usage; exit 0 ;;
      *) usage_error "unknown argument '$1'" ;;
    esac
    shift
  done
}

check_args() {
  [[ "$ENV_KIND" =~ ^(cpu|gpu|tpu|auto)$ ]] || usage_error "--env '$ENV_KIND': use cpu, gpu, tpu or auto"
  [[ -n "$RAY_VERSION" ]] || usage_error "--ray-version is required (the Ray version of the machine that runs invoke up)"
  [[ "$RAY_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+([.a-z0-9+-]*)$ ]] \
    || usage_error "--ray-version '$RAY_VERSION': expected a version such as 2.60.0"
  [[ -n "$PYTHON_VERSION" ]] || usage_error "--python-version is required (X.Y of the machine that runs invoke up)"
  [[ "$PYTHON_VERSION" =~ ^3\.[0-9]+$ ]] \
    || usage_error "--python-version '$PYTHON_VERSION': expected major.minor such as 3.11"
  [[ "$BACKEND" =~ ^(auto|conda|venv)$ ]] || usage_error "--backend '$BACKEND': use auto, conda or venv"
  [[ "$METRICS_FROM" =~ ^(any|conda-forge)$ ]] || usage_error "--metrics-from '$METRICS_FROM': use any or conda-forge"
  [[ "$LOCK_TIMEOUT" =~ ^[0-9]+$ ]] || usage_error "--lock-timeout '$LOCK_TIMEOUT': expected seconds"
  if [[ -n "$PYTHON_BIN" ]]; then
    [[ "$BACKEND" != conda ]] || usage_error "--python only applies to --backend venv"
    [[ "$(python_minor_of "$PYTHON_BIN")" == "$PYTHON_VERSION" ]] \
      || usage_error "--python $PYTHON_BIN is not a working Python $PYTHON_VERSION"
  fi
}

# ---------------------------------------------------------------- accelerator detection

# Prints cpu, gpu or tpu. Device files first: they exist even before a driver's tools are on PATH.
detect_accelerator() {
  local root=${RAYFLEET_SYSROOT:-}
  if compgen -G "$root/dev/nvidia[0-9]*" >/dev/null; then
    echo gpu; return
  fi
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo gpu; return
  fi
  # TPU v2-v4 VMs expose /dev/accel*; v5e and later bind the chips to VFIO. A VFIO group alone
  # could be any passed-through device, so it counts only next to a Google (0x1ae0) PCI device.
  if compgen -G "$root/dev/accel[0-9]*" >/dev/null; then
    echo tpu; return
  fi
  if compgen -G "$root/dev/vfio/[0-9]*" >/dev/null \
    && grep -qsx '0x1ae0' "$root"/sys/bus/pci/devices/*/vendor; then
    echo tpu; return
  fi
  echo cpu
}

# ---------------------------------------------------------------- helpers

home_dir() {
  # Startup scripts of some clouds run without HOME.
  if [[ -n "${HOME:-}" ]]; then echo "$HOME"; else getent passwd "$(id -u)" | cut -d: -f6; fi
}

# "3.11" if the interpreter $1 runs, nothing otherwise.
python_minor_of() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

# An interpreter of the pinned minor for the venv backend: --python, pythonX.Y, python3, python.
find_python() {
  local candidate path
  if [[ -n "$PYTHON_BIN" ]]; then
    echo "$PYTHON_BIN"; return
  fi
  for candidate in "python$PYTHON_VERSION" python3 python; do
    path=$(command -v "$candidate" 2>/dev/null) || continue
    if [[ "$(python_minor_of "$path")" == "$PYTHON_VERSION" ]]; then
      echo "$path"; return
    fi
  done
  return 1
}

# conda (or mamba) on PATH, in CONDA_EXE, or in a usual install location.
find_conda() {
  local home candidate
  home=$(home_dir)
  for candidate in "${CONDA_EXE:-}" "$(command -v conda 2>/dev/null || true)" \
    "$(command -v mamba 2>/dev/null || true)" "$(miniforge_dir)/bin/conda" \
    "$home/miniforge3/bin/conda" "$home/miniconda3/bin/conda" "$home/anaconda3/bin/conda" \
    /opt/conda/bin/conda; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then
      echo "$candidate"; return
    fi
  done
  return 1
}

miniforge_dir() {
  echo "${RAYFLEET_MINIFORGE_DIR:-$(home_dir)/miniforge3}"
}

# The env spec with the pins filled in.
render_spec() {
  local source=$1 target=$2
  [[ -f "$source" ]] || die "env spec $source is missing; is setup/ complete on this node?"
  sed -e "s/\${PYTHON_VERSION}/$PYTHON_VERSION/g" -e "s/\${RAY_VERSION}/$RAY_VERSION/g" \
    "$source" >"$target"
}

# The pip list of a rendered env spec (the items under "- pip:"), one per line.
pip_requirements() {
  awk '
    /^[[:space:]]*-[[:space:]]*pip:[[:space:]]*$/ { inpip = 1; indent = -1; next }
    inpip && /^[[:space:]]*#/ { next }
    inpip && /^[[:space:]]*-[[:space:]]/ {
      match($0, /^[[:space:]]*/)
      if (indent < 0) indent = RLENGTH
      if (RLENGTH == indent) { sub(/^[[:space:]]*-[[:space:]]*/, ""); print; next }
    }
    inpip && NF { inpip = 0 }
  ' "$1"
}

spec_digest() {
  sha256sum "$1" | cut -d' ' -f1
}

# "X.Y RAY_VERSION" as the env's own Python reports them, or nothing.
env_versions() {
  [[ -x "$PREFIX/bin/python" ]] || return 0
  "$PREFIX/bin/python" -c '
import importlib.metadata as m, sys
print("%d.%d %s" % (sys.version_info[0], sys.version_info[1], m.version("ray")))' 2>/dev/null || true
}

marker_value() {
  [[ -f "$PREFIX/$MARKER" ]] || return 0
  awk -v key="$1" 'index($0, key "=") == 1 { print substr($0, length(key) + 2); exit }' \
    "$PREFIX/$MARKER"
}

# True when the prefix holds a complete env with exactly these pins and this spec.
already_installed() {
  [[ -f "$PREFIX/$MARKER" && ! -e "$PREFIX/$PARTIAL" ]] || return 1
  [[ "$(marker_value env)" == "$ENV_KIND" && "$(marker_value ray_version)" == "$RAY_VERSION" \
    && "$(marker_value python_version)" == "$PYTHON_VERSION" \
    && "$(marker_value spec_sha256)" == "$SPEC_DIGEST" ]] || return 1
  if [[ "$BACKEND" != auto && "$(marker_value backend)" != "$BACKEND" ]]; then return 1; fi
  # Trust but verify: an env someone changed by hand is rebuilt.
  [[ "$(env_versions)" == "$PYTHON_VERSION $RAY_VERSION" ]]
}

# Clear the prefix for a fresh install, but only if this installer made what is there.
prepare_prefix() {
  if [[ -e "$PREFIX" ]]; then
    if [[ -e "$PREFIX/$MARKER" || -e "$PREFIX/$PARTIAL" ]]; then
      log "removing the previous env in $PREFIX (other pins, another spec or an interrupted install)"
      rm -rf -- "$PREFIX"
    elif [[ -d "$PREFIX" && -z "$(ls -A -- "$PREFIX")" ]]; then
      rmdir -- "$PREFIX"
    else
      die "$PREFIX exists and was not made by install.sh; remove it or pass another --prefix"
    fi
  fi
  mkdir -p -- "$PREFIX"
  # From here on a crash leaves a prefix that the next run recognises and replaces.
  : >"$PREFIX/$PARTIAL"
}

# ---------------------------------------------------------------- backends

download() {
  local url=$1 target=$2
  if command -v curl >/dev/null 2>&1; then
    run curl -fsSL --retry 3 -o "$target" "$url"
  elif command -v wget >/dev/null 2>&1; then
    run wget -q -O "$target" "$url"
  else
    die "neither curl nor wget is installed, so Miniforge cannot be downloaded; install one, or conda"
  fi
}

# Sets CONDA to Miniforge's conda, installing Miniforge first if needed.
install_miniforge() {
  local dir url installer lock_fd
  dir=$(miniforge_dir)
  url=${RAYFLEET_MINIFORGE_URL:-https://github.com/conda-forge/miniforge/releases/latest/download/Miniforge3-$(uname)-$(uname -m).sh}
  mkdir -p -- "$(dirname -- "$dir")"
  # Several envs may need Miniforge at once; only one downloads it.
  exec {lock_fd}>"$dir.lock"
  flock -w "$LOCK_TIMEOUT" "$lock_fd" || die "timed out waiting for the Miniforge install lock $dir.lock"
  if [[ ! -x "$dir/bin/conda" ]]; then
    installer=$(mktemp "${TMPDIR:-/tmp}/miniforge.XXXXXX.sh")
    CLEANUP+=("$installer")
    log "installing Miniforge into $dir (no conda on this node)"
    download "$url" "$installer"
    rm -rf -- "$dir"
    run bash "$installer" -b -p "$dir"
  fi
  exec {lock_fd}>&-
  CONDA="$dir/bin/conda"
}

install_conda() {
  local conda=$1 rendered=$2
  log "creating a conda env with Python $PYTHON_VERSION using $conda"
  run "$conda" create --yes --quiet --prefix "$PREFIX" "python=$PYTHON_VERSION" pip
  # The env file's pip section installs Ray and the libraries (pip runs inside the env).
  run "$conda" env update --quiet --prefix "$PREFIX" --file "$rendered"
  mkdir -p "$PREFIX/etc/conda/activate.d" "$PREFIX/etc/conda/deactivate.d"
  printf '# rayfleet: Ray never reports usage statistics from this env.\nexport RAY_USAGE_STATS_ENABLED=0\n' \
    >"$PREFIX/etc/conda/activate.d/rayfleet.sh"
  printf 'unset RAY_USAGE_STATS_ENABLED\n' >"$PREFIX/etc/conda/deactivate.d/rayfleet.sh"
}

install_venv() {
  local python=$1 rendered=$2 requirements reuse=0 venv_flags=()
  requirements="$PREFIX/rayfleet-requirements.txt"
  # Reuse the base interpreter's packages when it already has the pinned Ray: nothing to
  # download, and a node's preinstalled stack (e.g. a CUDA build of torch) stays in use.
  if ((ISOLATED == 0)) && "$python" -c '
import importlib.metadata as m, sys
sys.exit(m.version("ray") != sys.argv[1])' "$RAY_VERSION" 2>/dev/null; then
    reuse=1
    # --without-pip: the base's pip serves the venv, and no older pip/setuptools from
    # ensurepip shadow the base's (torch needs a recent setuptools, which pip would download).
    venv_flags=(--without-pip)
    log "$python already has Ray $RAY_VERSION: the venv reuses its packages"
  fi
  log "creating a venv with $python ($(python_minor_of "$python"))"
  try "$python" -m venv "${venv_flags[@]}" "$PREFIX" \
    || die "'$python -m venv' failed; on Debian/Ubuntu install the python$PYTHON_VERSION-venv package"
  if ((reuse)); then
    # A .pth file rather than --system-site-packages: when $python is itself a venv, its
    # packages are not in the base install that --system-site-packages would expose. The new
    # venv's own site-packages stay first on sys.path, so what pip installs there wins;
    # addsitedir also runs the .pth files of the reused folders, as the base itself does.
    "$python" -c '
import sys
for p in sys.path:
    if p.endswith(("site-packages", "dist-packages")):
        print(f"import site; site.addsitedir({p!r})")' \
      >"$("$PREFIX/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/rayfleet-base.pth"
  fi
  pip_requirements "$rendered" >"$requirements"
  # Offline first: when everything is already satisfied this touches no index at all.
  if try "$PREFIX/bin/python" -m pip install --no-index --disable-pip-version-check -r "$requirements"; then
    log "all requirements were already satisfied"
  else
    log "installing the requirements with pip (this downloads Ray and libraries)"
    run "$PREFIX/bin/python" -m pip install --disable-pip-version-check -r "$requirements"
  fi
  printf '\n# rayfleet: Ray never reports usage statistics from this env.\nexport RAY_USAGE_STATS_ENABLED=0\n' \
    >>"$PREFIX/bin/activate"
}

# Writes bin/ray (and Ray's other commands) into an env whose Ray lives in reused packages.
read -r -d '' ADD_RAY_SCRIPTS <<'PYTHON' || true
import importlib.metadata, os, sys

bindir = os.path.dirname(sys.executable)
for entry in importlib.metadata.distribution("ray").entry_points:
    path = os.path.join(bindir, entry.name)
    if entry.group != "console_scripts" or os.path.exists(path):
        continue
    module, _, attr = entry.value.partition(":")
    head = attr.split(".")[0]
    with open(path, "w") as script:
        script.write(f"#!{sys.executable}\nimport sys\nfrom {module} import {head}\n")
        script.write(f"sys.exit({attr}())\n")
    os.chmod(path, 0o755)
    print("added", path)
PYTHON

# ---------------------------------------------------------------- result

write_activation() {
  local backend=$1 env_var=VIRTUAL_ENV
  [[ "$backend" == conda ]] && env_var=CONDA_PREFIX
  cat >"$PREFIX/rayfleet-activate.sh" <<EOF
# Written by rayfleet's setup/install.sh. Source it to use this env: . $PREFIX/rayfleet-activate.sh
export PATH="$PREFIX/bin:\$PATH"
export $env_var="$PREFIX"
export RAYFLEET_ENV_PREFIX="$PREFIX"
# Ray never reports usage statistics from rayfleet nodes.
export RAY_USAGE_STATS_ENABLED=0
EOF
}

verify_env() {
  local got
  log "checking that the env imports Ray"
  run env RAY_USAGE_STATS_ENABLED=0 "$PREFIX/bin/python" -c 'import ray; print(ray.__version__)'
  got=$(env_versions)
  [[ "$got" == "$PYTHON_VERSION $RAY_VERSION" ]] \
    || die "the new env reports Python/Ray '$got', not '$PYTHON_VERSION $RAY_VERSION'"
  [[ -x "$PREFIX/bin/ray" ]] || die "the new env has no $PREFIX/bin/ray"
}

write_marker() {
  local backend=$1
  cat >"$PREFIX/$MARKER.tmp" <<EOF
env=$ENV_KIND
backend=$backend
ray_version=$RAY_VERSION
python_version=$PYTHON_VERSION
spec_sha256=$SPEC_DIGEST
installed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
  mv -f -- "$PREFIX/$MARKER.tmp" "$PREFIX/$MARKER"
  rm -f -- "$PREFIX/$PARTIAL"
}

# $1: "installed" or "already installed".
report() {
  local seconds
  seconds=$(elapsed)
  log "$1 in ${seconds}s"
  printf 'rayfleet env %s in %ss: env=%s backend=%s python=%s ray=%s\n' "$1" "$seconds" \
    "$ENV_KIND" "$(marker_value backend)" "$PYTHON_VERSION" "$RAY_VERSION"
  printf 'prefix:   %s\n' "$PREFIX"
  printf 'ray:      %s\n' "$PREFIX/bin/ray"
  printf 'activate: . %s\n' "$PREFIX/rayfleet-activate.sh"
  printf 'log:      %s\n' "$LOG"
}

# ---------------------------------------------------------------- main

# Prometheus for the head's metrics (--metrics); never fails the install.
install_prometheus() {
  ((METRICS)) || return 0
  if command -v prometheus >/dev/null 2>&1 || [[ -x "$PREFIX/bin/prometheus" ]]; then return 0; fi
  local -a sudo=()
  ((EUID == 0)) || sudo=(sudo -n)
  if [[ "$METRICS_FROM" == any ]] && command -v apt-get >/dev/null 2>&1 &&
     { ((EUID == 0)) || sudo -n true 2>/dev/null; }; then
    if try "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; then
      # The package's own service would hold port 9090 and scrape nothing of the cluster's.
      if command -v systemctl >/dev/null 2>&1; then try "${sudo[@]}" systemctl disable --now prometheus || true; fi
      return 0
    fi
  fi
  local conda=${CONDA:-}
  [[ -n "$conda" ]] || conda=$(find_conda) || conda=""
  if [[ -n "$conda" ]] && try "$conda" install -y -q -p "$PREFIX" -c conda-forge prometheus; then
    return 0
  fi
  log "metrics: no Prometheus package here (neither apt-get nor conda-forge); the cluster runs without metrics"
}

main() {
  parse_args "$@"
  if ((DETECT_ONLY)); then
    detect_accelerator
    return
  fi
  check_args
  if [[ "$ENV_KIND" == auto ]]; then
    ENV_KIND=$(detect_accelerator)
    log "detected accelerator: $ENV_KIND"
  fi
  PREFIX=${PREFIX:-$(home_dir)/.local/share/rayfleet/envs/$ENV_KIND}
  PREFIX=${PREFIX%/}
  mkdir -p -- "$(dirname -- "$PREFIX")"
  PREFIX="$(cd -- "$(dirname -- "$PREFIX")" && pwd)/$(basename -- "$PREFIX")"
  LOG=${LOG:-$PREFIX.install.log}
  mkdir -p -- "$(dirname -- "$LOG")"
  : >>"$LOG" || die "cannot write the log file $LOG; pass --log"
  command -v flock >/dev/null 2>&1 || die "flock (util-linux) is missing; install it"

  local lock_fd rendered
  exec {lock_fd}>"$PREFIX.lock"
  if ! flock -n "$lock_fd"; then
    log "another install into $PREFIX is running; waiting for it (up to ${LOCK_TIMEOUT}s)"
    flock -w "$LOCK_TIMEOUT" "$lock_fd" \
      || die "another install into $PREFIX still holds $PREFIX.lock after ${LOCK_TIMEOUT}s"
  fi

  rendered=$(mktemp "${TMPDIR:-/tmp}/rayfleet-env-$ENV_KIND.XXXXXX.yaml")
  CLEANUP+=("$rendered")
  render_spec "$SCRIPT_DIR/envs/environment_$ENV_KIND.yaml" "$rendered"
  SPEC_DIGEST=$(spec_digest "$rendered")

  if already_installed; then
    install_prometheus
    report "already installed"
    return
  fi

  log "installing the $ENV_KIND env (Python $PYTHON_VERSION, Ray $RAY_VERSION) into $PREFIX; log: $LOG"
  local backend=$BACKEND python=""
  if [[ "$backend" == auto || "$backend" == conda ]]; then
    CONDA=$(find_conda) || CONDA=""
  fi
  if [[ "$backend" == auto || "$backend" == venv ]]; then
    python=$(find_python) || python=""
  fi
  if [[ "$backend" == auto ]]; then
    if [[ -n "$CONDA" ]]; then backend=conda; elif [[ -n "$python" ]]; then backend=venv; else backend=conda; fi
  fi
  if [[ "$backend" == venv && -z "$python" ]]; then
    die "no Python $PYTHON_VERSION found for the venv backend (tried python$PYTHON_VERSION, python3, python); install it, pass --python, or use --backend conda"
  fi

  prepare_prefix
  cp -- "$rendered" "$PREFIX/rayfleet-environment.yaml"
  if [[ "$backend" == conda ]]; then
    [[ -n "$CONDA" ]] || install_miniforge
    install_conda "$CONDA" "$rendered"
  else
    install_venv "$python" "$rendered"
  fi
  # Packages reused from elsewhere (see install_venv) bring no scripts along: add Ray's.
  run "$PREFIX/bin/python" -c "$ADD_RAY_SCRIPTS"
  write_activation "$backend"
  verify_env
  write_marker "$backend"
  install_prometheus
  report "installed"
}

main "$@"

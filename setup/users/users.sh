#!/usr/bin/env bash
# rayfleet node users: the two system users a cloud node runs Ray and its autoscaler as.
#
#   sudo bash users.sh SOURCE_HOME [ray:PATH | scaler:PATH]...
#
# Run as root (the SSH user's sudo, or root itself) before Ray starts on a node; idempotent, so
# Ray's launcher may re-run it. It makes sure that
#   - rayfleet-ray exists: the user Ray (head, workers, every job, task, actor, Serve replica) runs
#     as. A system user with its own 0700 home, a login shell for `ray start`, no password, and
#     in no group that grants root (sudo, admin, wheel, adm, docker, lxd, disk, root, shadow);
#   - rayfleet-scaler exists as soon as one `scaler:` file is given (the head): the user Ray's
#     autoscaler runs as, apart from Ray's other processes, holding the cloud credential and the
#     cluster's SSH private key in its own 0700 home, which rayfleet-ray cannot enter;
#   - each USER:PATH (relative to SOURCE_HOME, the SSH user's home where rayfleet copied it over
#     SFTP or Ray's file mounts put it) is copied to the same place under that user's home, owned
#     by that user, modes kept (secrets arrive 0600). A missing PATH is skipped: not every cluster
#     has every file (no tracking password without tracking).
# Why two users and not the SSH user: the SSH user has passwordless sudo on Lambda's and Google's
# images, so whatever runs as it can become root and read everything (infra/providers/*/NOTES.md).
set -Eeuo pipefail

readonly RAY_USER=rayfleet-ray
readonly SCALER_USER=rayfleet-scaler
readonly ROOT_GROUPS="sudo admin wheel adm docker lxd disk root shadow"

die() { printf 'users.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo bash users.sh ...): it creates system users"
[ $# -ge 1 ] || die "usage: users.sh SOURCE_HOME [ray:PATH | scaler:PATH]..."
SOURCE_HOME=$1
shift
[ -d "$SOURCE_HOME" ] || die "SOURCE_HOME $SOURCE_HOME is not a directory"

make_user() {
  local user=$1
  if ! id -u "$user" >/dev/null 2>&1; then
    useradd --system --create-home --home-dir "/home/$user" --user-group --shell /bin/bash "$user"
  fi
  # An image may have put a user of this name into an admin group: take it out again. (One `id`
  # and no pipes: this runs on every autoscaled worker's way to joining Ray.)
  local group member home
  member=" $(id -nG "$user") "
  for group in $ROOT_GROUPS; do
    case $member in
      *" $group "*) gpasswd -d "$user" "$group" >/dev/null ;;
    esac
  done
  # (A user that existed before may have had no home made.)
  home=$(home_of "$user")
  mkdir -p "$home"
  chown "$user:$user" "$home"
  chmod 700 "$home"
}

home_of() { getent passwd "$1" | cut -d: -f6; }

give() {
  local user=$1 path=$2 target home
  [ -e "$SOURCE_HOME/$path" ] || return 0
  home=$(home_of "$user")
  target="$home/$path"
  mkdir -p "$(dirname "$target")"
  rm -rf "$target"
  cp -R --preserve=mode "$SOURCE_HOME/$path" "$target"
  # Every directory between the home and the file belongs to the user too (e.g. ~/.rayfleet).
  local dir
  dir=$(dirname "$path")
  while [ "$dir" != . ]; do
    chown "$user:$user" "$home/$dir"
    chmod go-w "$home/$dir"
    dir=$(dirname "$dir")
  done
  chown -R "$user:$user" "$target"
}

make_user "$RAY_USER"
for arg in "$@"; do
  case $arg in
    scaler:*) make_user "$SCALER_USER" ;;
  esac
done
for arg in "$@"; do
  case $arg in
    ray:*) give "$RAY_USER" "${arg#ray:}" ;;
    scaler:*) give "$SCALER_USER" "${arg#scaler:}" ;;
    *) die "argument $arg: expected ray:PATH or scaler:PATH" ;;
  esac
done
# A node environment that setup installed under the SSH user's home must be usable by Ray's user:
# the home becomes traversable (not listable); its secrets stay in 0700 directories and 0600 files.
if [ -d "$SOURCE_HOME/rayfleet/env" ]; then
  chmod o+x "$SOURCE_HOME" "$SOURCE_HOME/rayfleet"
fi

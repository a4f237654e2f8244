#!/usr/bin/env bash
# rayfleet node users: the system users a cloud node runs Ray, its autoscaler and the sharing
# gateway as.
#
#   sudo bash users.sh SOURCE_HOME [ray:PATH | scaler:PATH | gateway:PATH | starter:DIR]...
#
# Run as root (the SSH user's sudo, or root itself) before Ray starts on a node; idempotent, so
# Ray's launcher may re-run it. It makes sure that
#   - rayfleet-ray exists: the user Ray (head, workers, every job, task, actor, Serve replica) runs
#     as. A system user with its own 0700 home, a login shell for `ray start`, no password, and
#     in no group that grants root (sudo, admin, wheel, adm, docker, lxd, disk, root, shadow);
#   - rayfleet-scaler exists as soon as one `scaler:` file is given (the head): the user Ray's
#     autoscaler runs as, apart from Ray's other processes, holding the cloud credential and the
#     cluster's SSH private key in its own 0700 home, which rayfleet-ray cannot enter;
#   - rayfleet-gateway exists as soon as one `gateway:` file is given (a shared cluster's head):
#     the user the sharing gateway runs as. No login shell, no SSH key, no password, in no group
#     but its own; its home (0700, every folder in it too) holds the gateway's certificate, key,
#     data and its own copy of the Ray token, out of reach of Ray's user and every job;
#   - each USER:PATH (relative to SOURCE_HOME, the SSH user's home where rayfleet copied it over
#     SFTP or Ray's file mounts put it) is copied to the same place under that user's home, owned
#     by that user, modes kept (secrets arrive 0600). A missing PATH is skipped: not every cluster
#     has every file (no tracking password without tracking). Root only reads: the copy is
#     written by the user itself, so nothing that user left in its home (a symlink in place of a
#     folder, say) can turn a write of root's onto another file. A file is replaced in one rename
#     (the gateway reads its members file at every request: never a moment without one).
# Why two users and not the SSH user: the SSH user has passwordless sudo on Lambda's and Google's
# images, so whatever runs as it can become root and read everything (infra/providers/*/NOTES.md).
set -Eeuo pipefail

readonly RAY_USER=rayfleet-ray
readonly SCALER_USER=rayfleet-scaler
readonly GATEWAY_USER=rayfleet-gateway
readonly ROOT_GROUPS="sudo admin wheel adm docker lxd disk root shadow"

die() { printf 'users.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (sudo bash users.sh ...): it creates system users"
[ $# -ge 1 ] || die "usage: users.sh SOURCE_HOME [ray:PATH | scaler:PATH | gateway:PATH | starter:DIR]..."
SOURCE_HOME=$1
shift
[ -d "$SOURCE_HOME" ] || die "SOURCE_HOME $SOURCE_HOME is not a directory"

make_user() {
  local user=$1 shell=${2:-/bin/bash}
  if ! id -u "$user" >/dev/null 2>&1; then
    useradd --system --create-home --home-dir "/home/$user" --user-group --shell "$shell" "$user"
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

# The gateway's user, apart from make_user's: no shell to log in with, no key to log in by.
make_gateway_user() {
  make_user "$GATEWAY_USER" /usr/sbin/nologin
  usermod --shell /usr/sbin/nologin "$GATEWAY_USER" >/dev/null
  rm -rf "$(home_of "$GATEWAY_USER")/.ssh"
}

# Run as USER (give), in its home: unpack the tar on stdin (files root read) to the same paths,
# modes kept; a file replaced in one rename; the folders on the way made 0700 (`private` = 1) or
# without group/other write.
unpack() {
  set -Eeuo pipefail
  local path=$1 private=$2 staging dir
  staging=$(mktemp -d "$HOME/.rayfleet-give.XXXXXX")
  # shellcheck disable=SC2064  # the folder's name now: the trap runs after `staging` is gone
  trap "rm -rf '$staging'" EXIT
  tar -x -p -C "$staging" --no-same-owner
  mkdir -p "$(dirname "$path")"
  dir=$(dirname "$path")
  while [ "$dir" != . ]; do
    if [ "$private" = 1 ]; then chmod 700 "$dir"; else chmod go-w "$dir"; fi
    dir=$(dirname "$dir")
  done
  if [ -d "$staging/$path" ]; then
    rm -rf "$path"
    mv "$staging/$path" "$path"
  else
    mv -f -T "$staging/$path" "$path"
  fi
}

give() {
  local user=$1 path=$2 private=0
  [ -e "$SOURCE_HOME/$path" ] || return 0
  [ "$user" != "$GATEWAY_USER" ] || private=1
  tar -c -C "$SOURCE_HOME" -f - -- "$path" \
    | runuser -u "$user" -- env -i HOME="$(home_of "$user")" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        bash -c "$(declare -f unpack); cd ~ && unpack \"\$@\"" give "$path" "$private"
}

# `sharing.isolation: cluster`: the member starter (infra/node/member_starter.py), installed as
# root's own command, which the gateway's user may run through `sudo -n` and nothing else may:
# DIR (relative to SOURCE_HOME) holds its config (member-starter.json, which root alone then
# reads), the node package (node.zip, root's copy: the gateway's own could be changed by the
# gateway) and `python`, the folder of the head's Python with Ray (the SSH user's env, which
# neither the gateway nor Ray's user can write). DIR goes afterwards. The one sudoers rule names
# that one command, whose every argument the starter checks against root's config. All three live
# in /etc/rayfleet, root's (a test bed's hosts have an /etc of their own, not a /usr).
readonly STARTER=/etc/rayfleet/member-starter
readonly STARTER_LIB=/etc/rayfleet
install_starter() {
  local dir=$SOURCE_HOME/$1 py rule
  for name in member-starter.json node.zip python; do
    [ -f "$dir/$name" ] || die "starter:$1: no $name there"
  done
  py=$(head -n 1 "$dir/python")/python
  case $py in
    /*[!A-Za-z0-9/._+-]* | [!/]*) die "starter:$1: python $py is not an absolute plain path" ;;
  esac
  [ -x "$py" ] || die "starter:$1: $py is not executable"
  install -d -o root -g root -m 0755 "$STARTER_LIB"
  install -o root -g root -m 0600 "$dir/member-starter.json" /etc/rayfleet/member-starter.json
  install -o root -g root -m 0644 "$dir/node.zip" "$STARTER_LIB/member-starter.zip"
  # -I: no PYTHONPATH, user site or current folder; env -i: nothing of the caller's environment.
  printf '%s\n' '#!/bin/sh' \
    "exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin $py -I -c 'import sys; sys.path.insert(0, \"$STARTER_LIB/member-starter.zip\"); from infra.node.member_starter import main; sys.exit(main())' --config /etc/rayfleet/member-starter.json \"\$@\"" \
    > "$STARTER.new"
  chown root:root "$STARTER.new"
  chmod 0755 "$STARTER.new"
  mv -f "$STARTER.new" "$STARTER"
  rule=$(mktemp)
  printf '%s ALL=(root) NOPASSWD: %s\n' "$GATEWAY_USER" "$STARTER" > "$rule"
  visudo -cqf "$rule" || die "the member starter's sudoers rule does not parse"
  install -o root -g root -m 0440 "$rule" /etc/sudoers.d/rayfleet-member-starter
  rm -f "$rule"
  rm -rf "$dir"
}

make_user "$RAY_USER"
for arg in "$@"; do
  case $arg in
    scaler:*) make_user "$SCALER_USER" ;;
    gateway:* | starter:*) make_gateway_user ;;
  esac
done
for arg in "$@"; do
  case $arg in
    ray:*) give "$RAY_USER" "${arg#ray:}" ;;
    scaler:*) give "$SCALER_USER" "${arg#scaler:}" ;;
    gateway:*) give "$GATEWAY_USER" "${arg#gateway:}" ;;
    starter:*) install_starter "${arg#starter:}" ;;
    *) die "argument $arg: expected ray:PATH, scaler:PATH, gateway:PATH or starter:DIR" ;;
  esac
done
# A node environment that setup installed under the SSH user's home must be usable by Ray's user:
# the home becomes traversable (not listable); its secrets stay in 0700 directories and 0600 files.
if [ -d "$SOURCE_HOME/rayfleet/env" ]; then
  chmod o+x "$SOURCE_HOME" "$SOURCE_HOME/rayfleet"
fi

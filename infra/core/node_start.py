"""Ray's start on a cloud node: `bash ~/rayfleet/users/node.sh head|worker` (setup/users/node.sh),
with the cluster's node.conf beside it, rendered here (templates/node.conf.j2).

A start line in a Ray cluster YAML stays a few words; what is long (users.sh's file list, the
words Ray's user's shell runs before `ray start`, Ray's flags) is in node.conf, a file a person
reads like the commands it stands for. It travels with the node users' scripts: the users folder
of Ray's file mounts is `stage`d per cluster (setup/users/ and node.conf), Lambda's autoscaling
head gets it over SFTP and its workers in their kit. No secret is in it.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.core import privilege, render
from infra.node import shell
from infra.node.files import atomic_write

#: The start script and its settings on a node, relative to the SSH user's home.
SCRIPT = f"{privilege.USERS_DIR}/node.sh"
CONF_NAME = "node.conf"
CONF = f"{privilege.USERS_DIR}/{CONF_NAME}"
#: Where an up stages a cluster's users folder for Ray's file mounts (under its rendered dir).
STAGED = "users"


@dataclass(frozen=True)
class Role:
    """One role's start (the head's or a worker's), in the words the start commands had."""

    #: What it is, for the comment above it in node.conf.
    what: str
    #: users.sh's `USER:PATH` arguments (privilege.setup_users's).
    files: Sequence[str]
    #: Shell run by Ray's user's shell before `ray start` (`VAR=value ` words of our own).
    env: str
    #: `ray start`'s flags, words of our own (node.sh expands them: `$RAY_HEAD_IP`).
    flags: str
    #: Files that leave the SSH user's home once handed over.
    moved: Sequence[str] = ()


def ray_up_head(ray_env: str, ray_start_args: str, tracking: bool,
                scaler_files: Sequence[str] = ()) -> Role:
    """A head that `ray up` starts (Ray's own node provider on the head, v1 autoscaler): the
    users, the autoscaler's user given `ray up`'s config and key (and `scaler_files`, e.g. the
    file mounts it syncs to new workers), then Ray as Ray's user without a monitor. GCS listens on
    every address, loopback included.

    The monitor is not started here: its supervisor needs the node package, which reaches the
    head only after `ray up` (remote_head.start_ray_up_monitor runs privilege.ray_up_monitor)."""
    ray = privilege.ray_files(tracking)
    scaler = (*privilege.RAY_UP_SCALER_FILES, *ray, *scaler_files, privilege.USERS_DIR)
    return Role("The head: Ray without its own autoscaler (Ray's v1 monitor runs apart).",
                privilege.user_files(ray, scaler), ray_env, f"--head --no-monitor {ray_start_args}")


def command(role: str, source: str = "~") -> str:
    """The start line: node.sh under `source` (`~`, or a folder in it) with `role`. `~` rather
    than "$HOME": it expands to one word whatever the home's name, and reads as a path."""
    if not re.fullmatch(r"~(/[A-Za-z0-9_./-]+)?", source) or role not in ("head", "worker"):
        raise ValueError(f"node.sh takes head or worker under ~ (got {role!r} under {source!r})")
    return f"bash {source}/{SCRIPT} {role}"


def _words(text: str) -> list[str]:
    """`text`'s shell words as written (quotes kept): split at the spaces outside quotes and
    `$(...)`."""
    words: list[str] = []
    word = ""
    open_: list[str] = []  # the quotes and `$(` the scan is inside, innermost last
    i = 0
    while i < len(text):
        c, top = text[i], open_[-1] if open_ else ""
        if top == "'":
            if c == "'":
                open_.pop()
        elif c == "\\":
            word, i = word + text[i:i + 2], i + 2
            continue
        elif text.startswith("$(", i):
            open_.append("$(")
            word, i = word + "$(", i + 2
            continue
        elif (c == ")" and top == "$(") or (c == '"' and top == '"'):
            open_.pop()
        elif c == '"' or (c == "'" and top != '"'):
            open_.append(c)
        elif c == " " and not open_:
            words += [word] if word else []
            word, i = "", i + 1
            continue
        word, i = word + c, i + 1
    return [*words, word] if word else words


def _lines(env: str) -> list[shell.Shell]:
    """`env`'s words, an assignment or a command a line (each one quoted array element)."""
    lines: list[list[str]] = []
    for token in _words(env):
        ends = bool(lines) and (lines[-1][-1] == "&&" or lines[-1][-1].endswith(";"))
        if not lines or ends or ("=" in token and token.split("=", 1)[0].isidentifier()):
            lines.append([token])
        else:
            lines[-1].append(token)
    return [shell.quoted(" ".join(words)) for words in lines]


def conf(cluster: str, rendered_by: str, roles: dict[str, Role], activate: str = "",
         private: str = "", guard: Sequence[str] = (), tpu_env: str = "") -> str:
    """node.conf for `roles` (`head`, `worker`). `activate`: the node env's activation script (a
    shell word); `private`: a folder of the SSH user's home kept 0700; `guard`: addresses for
    guard.sh; `tpu_env`: where Ray's TPU attributes go in Ray's user's home (workers)."""
    return render.render(
        "node.conf.j2", cluster=cluster, rendered_by=rendered_by,
        activate=shell.Shell(activate), private=private, guard=list(guard), tpu_env=tpu_env,
        roles={name: {"what": r.what, "files": list(r.files), "moved": list(r.moved),
                      "env": _lines(r.env),
                      "flags": [shell.Shell(w) for w in _words(r.flags)]}
               for name, r in roles.items()})


def stage(folder: Path, conf_text: str) -> Path:
    """`folder`/users: setup/users/ as shipped and `conf_text` as node.conf, the folder Ray's
    file mounts put at privilege.USERS_DIR on every node (replaced whole)."""
    target = folder / STAGED
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(privilege.SCRIPTS_SOURCE, target)
    atomic_write(target / CONF_NAME, conf_text)
    return target


def files(conf_text: str, source: str = "") -> dict[str, tuple[bytes, int]]:
    """The start script, ray.sh and node.conf for an SFTP upload (home-relative path -> (content,
    mode)), under `source` (a folder of the home, or the home)."""
    base = f"{source}/" if source else ""
    scripts = {f"{base}{privilege.USERS_DIR}/{name}": (
        (privilege.SCRIPTS_SOURCE / name).read_bytes(), 0o755)
        for name in ("node.sh", "ray.sh", "users.sh")}
    return {**scripts, f"{base}{CONF}": (conf_text.encode(), 0o644)}

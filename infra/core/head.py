"""Hands on a cluster's head: a shell, one command, files to and from it (`invoke ssh|exec|sync`).

Each provider says how its head is reached (`Provider.head_access`): over SSH, with the same target,
key, proxy and host-key rules as every other SSH rayfleet does there; or, for a head on this
machine, directly, with the cluster's Ray environment set. This module turns that into `ssh` and
`rsync` command lines and runs them; it knows no provider.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from infra.core import ssh
from infra.core.errors import UsageError
from infra.node.files import atomic_write
from infra.node.where import home_path


@dataclass(frozen=True)
class HeadAccess:
    """How this machine reaches a cluster's head, for a shell, a command or rsync."""

    #: The head's SSH login; None when the head is this machine (the local provider, a Slurm head
    #: on this host): commands then run here, in the cluster's environment.
    target: ssh.SshTarget | None
    #: For messages: "user@host via ..." or "this machine".
    where: str
    #: Environment that makes Ray's own tools reach the cluster where `ssh`/`exec` commands run
    #: (on the head: its GCS and its copy of the token; local: the `invoke env` variables).
    env: dict[str, str] = field(default_factory=dict)
    #: The job API / dashboard port on the head's loopback (what a tunnel forwards to).
    dashboard_port: int | None = None
    #: The Ray Client server port on the head's loopback (for `ray.init("ray://...")`).
    client_port: int | None = None
    #: The Python (shell word) and activation prefix that run node modules on a remote head in
    #: its node environment (Ray's Python, with aiohttp): head daemons such as the gateway.
    python: str = "python3"
    activate: str = ""
    #: Where the head's own batch job runs the sharing gateway (Slurm): a folder on the head's
    #: shared filesystem (`~/`-relative or absolute) that `up` fills with the gateway's config,
    #: certificate and data, and from which the job's supervisor starts it, so that it ends with
    #: the job. None: `up` starts it over SSH (remote_head.install_daemon) or here.
    gateway_home: str | None = None
    #: More names members reach the head by, for the gateway's certificate (Slurm: the node's
    #: name, and 127.0.0.1/localhost for a member's own SSH tunnel through a login host).
    names: tuple[str, ...] = ()
    #: The tracking server's password file on the head, when not where remote heads keep it
    #: (Slurm: the job's keys dir); the gateway keeps its content out of every answer.
    tracking_password: str | None = None


def _ssh_base(target: ssh.SshTarget) -> list[str]:
    return ["ssh", *ssh.openssh_options(target)]


def shell_argv(access: HeadAccess, command: str | None = None) -> list[str]:
    """The command line of `invoke ssh` (command None: a login shell) and `invoke exec`."""
    if access.target is None:
        if command is None:
            return [os.environ.get("SHELL") or "bash"]
        return ["bash", "-c", command]
    tty = ["-t"] if command is None and sys.stdin.isatty() else []
    argv = [*_ssh_base(access.target), *tty, f"{access.target.user}@{access.target.host}"]
    # A leading ~/ is left to the remote shell's $HOME (the head's home, not ours).
    exports = " ".join(f"{k}={home_path(v)}" for k, v in access.env.items())
    line = 'exec "${SHELL:-bash}" -l' if command is None else command
    # ssh hands the rest to the remote user's shell as one line, the command exactly as typed.
    return [*argv, "--", f"export {exports}; {line}" if exports else line]


def run(access: HeadAccess, command: str | None = None) -> int:
    """Run a shell (or `command`) on the head, attached to this terminal; its exit code."""
    env = dict(os.environ)
    if access.target is None:
        env.update({k: os.path.expanduser(v) for k, v in access.env.items()})
    try:
        return subprocess.run(shell_argv(access, command), env=env, check=False).returncode
    except FileNotFoundError as exc:
        raise UsageError(f"{exc.filename} is not installed here; install it "
                         "(Debian: apt-get install openssh-client)") from None


def ssh_config(target: ssh.SshTarget) -> str:
    """An ssh_config that makes plain `ssh` behave like `ssh.openssh_options(target)`: for tools
    that take an ssh command as one string (rsync -e), where a ProxyCommand with quotes or spaces
    would not survive their word splitting."""
    options = ssh.openssh_options(target)
    lines = ["Host *", f"  User {target.user}"]
    names = {"-i": "IdentityFile", "-p": "Port"}
    for flag, value in zip(options[::2], options[1::2], strict=True):
        if flag == "-o":
            key, _, rest = value.partition("=")
            lines.append(f"  {key} {rest}")
        else:
            lines.append(f"  {names[flag]} {value}")
    return "\n".join(lines) + "\n"


@contextmanager
def _config_file(target: ssh.SshTarget) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rayfleet-ssh-") as folder:
        path = Path(folder) / "config"
        atomic_write(path, ssh_config(target), mode=0o600)  # ssh refuses one others can write
        yield path


Direction = Literal["up", "down"]


def rsync_argv(access: HeadAccess, direction: Direction, local: str, remote: str,
               config: Path | None) -> list[str]:
    """rsync from this machine to the head (`up`) or back (`down`), archive mode, compressed."""
    if direction not in ("up", "down"):
        raise UsageError(f"sync {direction}: the direction is `up` (to the head) or `down`")
    argv = ["rsync", "-az"]
    if access.target is None:
        far = remote
    else:
        if config is None:
            raise ValueError("a remote head needs an ssh config")
        argv += ["-e", f"ssh -F {shlex.quote(str(config))}"]
        far = f"{access.target.host}:{remote}"
    return argv + ([local, far] if direction == "up" else [far, local])


def sync(access: HeadAccess, direction: Direction, local: str, remote: str) -> int:
    """Copy files between this machine and the head with rsync over the head's SSH path."""
    if direction == "up" and not Path(local).exists():
        raise UsageError(f"sync up {local}: no such file or folder here")
    try:
        if access.target is None:
            argv = rsync_argv(access, direction, local, remote, None)
            return subprocess.run(argv, check=False).returncode
        with _config_file(access.target) as config:
            argv = rsync_argv(access, direction, local, remote, config)
            return subprocess.run(argv, check=False).returncode
    except FileNotFoundError as exc:
        raise UsageError(f"{exc.filename} is not installed here; install it "
                         "(Debian: apt-get install rsync openssh-client)") from None

"""The words every SSH of rayfleet speaks (infra/core/ssh.py's paramiko sessions and
infra/core/ssh_tunnel.py's OpenSSH tunnels): one host to log into (`SshTarget`), what a remote
command did (`Result`), the errors, and where a host's key is pinned."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from infra.core import paths
from infra.core.errors import RayfleetError


class SshError(RayfleetError):
    """An SSH login, command or tunnel failed; the message names the host and the reason."""


class HostKeyError(SshError):
    """A host's key differs from the pinned one, or a strictly checked host is unknown: never retried."""


#: `accept-new`: unknown hosts are accepted once and pinned; `strict`: they must be known already.
HostKeyPolicy = Literal["accept-new", "strict"]


def cluster_known_hosts(cluster: str) -> Path:
    """The known_hosts file that pins the host keys of one cluster's instances (removed by
    `invoke teardown`)."""
    return paths.keys_dir(cluster) / "known_hosts"


def user_known_hosts() -> Path:
    return Path("~/.ssh/known_hosts").expanduser()



@dataclass(frozen=True)
class SshTarget:
    """One host to log into."""

    #: Address or name as this machine (or the proxy command) reaches it.
    host: str
    #: Login user (e.g. "ubuntu" on Lambda).
    user: str
    #: Private key file; the key is never read into anything but paramiko/OpenSSH.
    key_path: Path
    port: int = 22
    #: OpenSSH-style ProxyCommand (`%h`, `%p`, `%r` expanded), e.g. `ssh -W %h:%p bastion`; None
    #: for a direct TCP connection.
    proxy_command: str | None = None
    #: Where the host's key is pinned; None means the user's ~/.ssh/known_hosts.
    known_hosts: Path | None = None
    #: How a host missing from `known_hosts` is treated (see HostKeyPolicy).
    host_key_policy: HostKeyPolicy = "accept-new"

    def __str__(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")


@dataclass(frozen=True)
class Result:
    """What a remote command did."""

    exit_code: int
    stdout: str
    stderr: str = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0



def known_hosts_path(target: SshTarget) -> Path:
    """The known_hosts file that holds (or will pin) `target`'s host key."""
    return target.known_hosts or user_known_hosts()



def changed_key(target: SshTarget, hostname: str, path: Path) -> str:
    """The error text for a host key that differs from the one pinned in `path`."""
    return (f"ssh {target}: the host key of {hostname} CHANGED since it was pinned in {path}; "
            "if the host was legitimately replaced, remove its line there, else do not connect")



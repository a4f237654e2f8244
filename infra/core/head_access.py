"""The head interface, `HeadAccess`: how this machine reaches a cluster's head and what it does
there (run, put, read, tunnel, daemons, a user's shell and rsync), with the small types its methods
take and give. Its implementations are in infra/core/head.py (`SharedFsHead`, and `LocalHead` of
infra/core/head_local.py) and infra/core/head_ssh.py (`SshHead`)."""

from __future__ import annotations

import abc
import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from infra.core import ssh
from infra.core.errors import UsageError
from infra.node import gateway_config
from infra.node.tracking import NODE_PASSWORD_PATH

Direction = Literal["up", "down"]


class GatewayFiles(NamedTuple):
    """Where a head keeps the sharing gateway's files (paths as `HeadAccess` methods take them)."""

    config: str
    data: str
    cert: str
    key: str
    log: str


class Forward(NamedTuple):
    """A detached forward of the head's ports (`HeadAccess.forward`)."""

    #: name -> the port on this machine that reaches it.
    local: dict[str, int]
    #: The tunnel's ssh process and whether an earlier command opened it; pid None: no tunnel
    #: was needed (the ports are this machine's own).
    pid: int | None = None
    reused: bool = False


@dataclass(frozen=True, kw_only=True)
class HeadAccess(abc.ABC):
    """How this machine reaches a cluster's head, and what it does there."""

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
    #: More names members reach the head by, for the gateway's certificate (Slurm: the node's
    #: name, and 127.0.0.1/localhost for a member's own SSH tunnel through a login host).
    names: tuple[str, ...] = ()
    #: The tracking server's password file on the head (the gateway keeps its content out of
    #: every answer).
    tracking_password: str = NODE_PASSWORD_PATH

    # --- what the head is, for those who configure its daemons -------------------------------

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """The head's address as members and messages name it."""

    @property
    @abc.abstractmethod
    def listen_host(self) -> str:
        """Where a service for others listens there (a head that is this machine serves this
        machine only)."""

    @property
    @abc.abstractmethod
    def node_users(self) -> bool:
        """Whether its daemons may run as the node's own users of infra/core/privilege.py (a head
        rayfleet set up, with sudo)."""

    @abc.abstractmethod
    def head_path(self, path: str) -> str:
        """`path` as a daemon on the head opens it (Python's open does not expand `~`)."""

    @abc.abstractmethod
    def gateway_files(self, cluster: str) -> GatewayFiles:
        """Where the sharing gateway's config, data, certificate, key and log live there."""

    # --- the interface -----------------------------------------------------------------------

    @abc.abstractmethod
    def run(self, command: str, timeout: float = 60.0, check: bool = False) -> ssh.Result:
        """Run a shell command line on the head, in its node environment; its output. `check`:
        a non-zero exit raises (RayfleetError naming the command's last line)."""

    @abc.abstractmethod
    def run_node(self, module: str, args: str, timeout: float = 60.0,
                 check: bool = False) -> ssh.Result:
        """`run` of `python -m <module> <args>` (a module of the node package, this checkout's;
        `args` is shell, already quoted)."""

    @abc.abstractmethod
    def fetch(self, path: str, local: Path) -> None:
        """Copy the head's file `path` to `local` on this machine, then remove it from the head
        (a snapshot made for this copy); OSError or RayfleetError when it cannot."""

    @abc.abstractmethod
    def put_private(self, files: dict[str, bytes], user: str | None = None) -> None:
        """Write 0600 files on the head in this order, each whole or not at all (a reader never
        sees half of one), their missing folders made 0700. `user`: a node user of
        infra/core/privilege.py whose home holds them (only where `node_users`)."""

    @abc.abstractmethod
    def read(self, path: str, user: str | None = None) -> str | None:
        """A small file on the head (in node user `user`'s home when given); None when it is
        absent, empty or the head cannot say."""

    @abc.abstractmethod
    def tunnels(self, remotes: list[tuple[str, int]]) -> contextlib.AbstractContextManager[list[int]]:
        """Ports on this machine that reach each (host, port) as the head sees it, while the block
        runs: one SSH login's forwards (`ssh.start_tunnel`), or the ports themselves."""

    @contextlib.contextmanager
    def tunnel(self, port: int, host: str = "127.0.0.1") -> Iterator[int]:
        """One local port that reaches `host:port` as the head sees it, while the block runs."""
        with self.tunnels([(host, port)]) as ports:
            yield ports[0]

    @abc.abstractmethod
    def forward(self, cluster: str, remote: dict[str, int]) -> Forward:
        """Like `tunnels`, for ports on the head's loopback, outliving this command (a shell's
        `eval "$(invoke env)"`): the cluster's one detached tunnel (infra/core/tunnels.py)."""

    @abc.abstractmethod
    def ensure_daemon(self, module: str, config_path: str, config_text: str,
                      secrets: dict[str, bytes] | None = None, log: str = "",
                      user: str | None = None, copies: tuple[str, ...] = (),
                      replace: bool = True, wait: bool = True, restart: str = "on-failure") -> bool:
        """Run `python -m <module> --config <config_path>` (a module of the node package) on the
        head, supervised (infra/node/supervise.py: started again within seconds whenever it dies,
        until it exits 0), unless it runs with this config; one whose config differs is started
        again with the new one (`replace` False: one that runs keeps the config it started with,
        for a daemon whose change waits for a new head). True when this call started it. `secrets`
        (path -> content) go first as 0600 files; no secret is ever on a command line. `user`,
        `copies`: as `remote_head.install_daemon`. `wait` False: return before its supervisor has
        started, where that start is this command's own (a head on this machine, beside a Ray
        that is starting); a remote head's start is one SSH command either way. `restart`: the
        supervisor's restart policy (infra/node/supervise.py POLICIES; `always` also restarts a
        daemon that exits 0: the sharing gateway)."""

    @abc.abstractmethod
    def stop_daemon(self, config_path: str, user: str | None = None) -> None:
        """Stop a daemon `ensure_daemon` started (exactly the processes its pid file names)."""

    @abc.abstractmethod
    def read_with_status(self, path: str, config_path: str, user: str | None = None,
                         ) -> tuple[str | None, dict[str, Any] | None]:
        """A small file on the head and the status (`supervise status`) of the daemon configured
        by `config_path`, in one round trip; (None, None) when the head cannot say."""

    @abc.abstractmethod
    def answers(self, port: int, timeout: float) -> bool:
        """Whether something accepts connections on the head's loopback `port` within `timeout`."""

    # --- a user's hands on the head (`invoke ssh|exec|sync`) ---------------------------------

    @abc.abstractmethod
    def shell_argv(self, command: str | None = None) -> list[str]:
        """The command line of `invoke ssh` (command None: a login shell) and `invoke exec`."""

    def shell_env(self) -> dict[str, str]:
        """The environment `shell_argv` runs in on this machine."""
        return dict(os.environ)

    def attach(self, command: str | None = None, cluster: str = "") -> int:
        """Run a shell (or `command`) on the head, attached to this terminal; its exit code."""
        try:
            return subprocess.run(self.shell_argv(command), env=self.shell_env(),
                                  check=False).returncode
        except FileNotFoundError as exc:
            raise UsageError(f"{exc.filename} is not installed here; install it "
                             "(Debian: apt-get install openssh-client)") from None

    @abc.abstractmethod
    def rsync_target(self) -> contextlib.AbstractContextManager[tuple[list[str], str]]:
        """(rsync options, the prefix of a path on the head) while the block runs."""

    def rsync_argv(self, direction: Direction, local: str, remote: str, options: list[str],
                   prefix: str) -> list[str]:
        """rsync from this machine to the head (`up`) or back (`down`), archive mode, compressed."""
        if direction not in ("up", "down"):
            raise UsageError(f"sync {direction}: the direction is `up` (to the head) or `down`")
        far = prefix + remote
        return ["rsync", "-az", *options] + ([local, far] if direction == "up" else [far, local])

    def sync(self, direction: Direction, local: str, remote: str) -> int:
        """Copy files between this machine and the head with rsync over the head's SSH path."""
        if direction == "up" and not Path(local).exists():
            raise UsageError(f"sync up {local}: no such file or folder here")
        try:
            with self.rsync_target() as (options, prefix):
                argv = self.rsync_argv(direction, local, remote, options, prefix)
                return subprocess.run(argv, check=False).returncode
        except FileNotFoundError as exc:
            raise UsageError(f"{exc.filename} is not installed here; install it "
                             "(Debian: apt-get install rsync openssh-client)") from None


def checked(result: ssh.Result, command: str, where: str) -> ssh.Result:
    """`result`, unless its command failed: then RayfleetError naming the command, where it
    ran and its last line of output."""
    if not result.ok:
        from infra.core.errors import RayfleetError

        last = (result.stderr.strip() or result.stdout.strip()).splitlines() or ["no output"]
        raise RayfleetError(f"`{command.split()[0] if command.split() else command}` on {where} "
                            f"exited {result.exit_code}: {last[-1].strip()}")
    return result



def rooted(root: str) -> GatewayFiles:
    """The gateway's files of a head whose daemons keep them under `root`."""
    return GatewayFiles(f"{root}/{gateway_config.CONFIG_FILE}", f"{root}/gateway",
                        f"{root}/gateway.pem", f"{root}/gateway.key", f"{root}/gateway.log")



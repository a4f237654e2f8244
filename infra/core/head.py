"""A cluster's head, one interface for every way this machine reaches it (`HeadAccess`).

Each provider says how its head is reached (`Provider.head_access`) by returning one of three
implementations, and nothing above it asks again where the head is:

- `LocalHead` (infra/core/head_local.py): the head is this machine (the local provider): commands
  run here in the cluster's environment, files are this machine's, daemons start under
  `infra.node.supervise.ensure`.
- `SshHead` (infra/core/head_ssh.py): the head is behind an SSH login (Lambda, GCP, a Slurm compute
  node): commands over SSH, files over SFTP (infra/core/remote_head.py), daemons through
  `remote_head.install_daemon`, tunnels through `ssh.start_tunnel`, with the same target, key,
  proxy and host-key rules as every other SSH rayfleet does there.
- `SharedFsHead` (here): the head's daemons are started by the head's own batch job from files on the
  site's shared file system (Slurm): files go there through the node (one of the two above),
  and "ensure a daemon" means putting its config where the job's supervisor starts it.

The interface itself is infra/core/head_access.py's (it also turns an access into `ssh`/`rsync`
command lines for `invoke ssh|exec|sync`); this module names them all, as callers import them. Every
path given to these methods is `~/`-relative (the head user's home) or absolute. None of them knows
a provider.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.core import ssh, ui
from infra.core.head_access import Direction, Forward, GatewayFiles, HeadAccess, checked, rooted
from infra.core.head_local import LocalHead

#: The names this module has long been imported by; the interface and `LocalHead` now live in
#: infra/core/head_access.py and infra/core/head_local.py.
__all__ = ["Direction", "Forward", "GatewayFiles", "HeadAccess", "LocalHead", "SharedFsHead",
           "checked", "rooted"]


@dataclass(frozen=True, kw_only=True)
class SharedFsHead(HeadAccess):
    """A head whose own batch job runs its daemons from files on the site's shared file system:
    `private_root` there holds them, `node` (the head's node: this machine or an SSH login) is
    how anything else reaches it. The job starts a daemon once its config is there and ends it
    with the job: nothing is started or stopped from here."""

    node: HeadAccess
    private_root: str

    @property
    def address(self) -> str:
        return self.node.address

    @property
    def listen_host(self) -> str:
        return self.node.listen_host

    @property
    def node_users(self) -> bool:
        return False

    def head_path(self, path: str) -> str:
        # The job runs its daemons from its user's home.
        return path.removeprefix("~/")

    def gateway_files(self, cluster: str) -> GatewayFiles:
        return rooted(self.private_root)

    def run(self, command: str, timeout: float = 60.0, check: bool = False) -> ssh.Result:
        return self.node.run(command, timeout, check)

    def run_node(self, module: str, args: str, timeout: float = 60.0,
                 check: bool = False) -> ssh.Result:
        return self.node.run_node(module, args, timeout, check)

    def fetch(self, path: str, local: Path) -> None:
        self.node.fetch(path, local)

    def put_private(self, files: dict[str, bytes], user: str | None = None) -> None:
        self.node.put_private(files, user)

    def read(self, path: str, user: str | None = None) -> str | None:
        return self.node.read(path, user)

    def tunnels(self, remotes: list[tuple[str, int]]) -> contextlib.AbstractContextManager[list[int]]:
        return self.node.tunnels(remotes)

    def forward(self, cluster: str, remote: dict[str, int]) -> Forward:
        return self.node.forward(cluster, remote)

    def ensure_daemon(self, module: str, config_path: str, config_text: str,
                      secrets: dict[str, bytes] | None = None, log: str = "",
                      user: str | None = None, copies: tuple[str, ...] = (),
                      replace: bool = True, wait: bool = True, restart: str = "on-failure") -> bool:
        """The secrets, then the config last: the job starts the daemon as soon as it is there
        (True: no config was there before). A daemon the job already started keeps its settings
        until the next job, whatever `replace` says (said in one line when they changed). The
        job's script gives each daemon its restart policy (templates/slurm.sbatch.j2)."""
        before = self.read(config_path)
        if before is not None and before.strip() != config_text.strip() and replace:
            ui.warn(f"{module.rsplit('.', 1)[-1]}: the head's job started it with the settings "
                    "it had then; the changed ones apply from the next job (`invoke teardown`, "
                    "then `invoke up`)")
        self.put_private({**(secrets or {}), config_path: config_text.encode()}, user)
        return before is None

    def stop_daemon(self, config_path: str, user: str | None = None) -> None:
        """Nothing to do: it ends with the head's job, which teardown cancels."""

    def read_with_status(self, path: str, config_path: str, user: str | None = None,
                         ) -> tuple[str | None, dict[str, Any] | None]:
        return self.node.read_with_status(path, config_path, user)

    def answers(self, port: int, timeout: float) -> bool:
        return self.node.answers(port, timeout)

    def shell_argv(self, command: str | None = None) -> list[str]:
        return self.node.shell_argv(command)

    def shell_env(self) -> dict[str, str]:
        return self.node.shell_env()

    def attach(self, command: str | None = None, cluster: str = "") -> int:
        return self.node.attach(command, cluster)

    def rsync_target(self) -> contextlib.AbstractContextManager[tuple[list[str], str]]:
        return self.node.rsync_target()

"""`SshHead`: a cluster's head behind an SSH login (Lambda, GCP, a Slurm compute node), the
`HeadAccess` of infra/core/head.py over infra/core/remote_head.py's SFTP, commands and supervised daemons,
with the same target, key, proxy and host-key rules as every other SSH rayfleet does there. Every
tunnel starts in `ssh.start_tunnel`; `invoke env`'s detached one is infra/core/tunnels.py's."""

from __future__ import annotations

import contextlib
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.core import remote_head, ssh, tunnels
from infra.core.head import Forward, GatewayFiles, HeadAccess, rooted
from infra.node.files import atomic_write
from infra.node.where import home_path


def _probe(port: int, timeout: float) -> str:
    """Shell that exits 0 once the head's loopback `port` accepts (bash's /dev/tcp: nothing to
    install), 1 after `timeout` seconds."""
    tries = max(1, int(timeout / 0.3))
    probe = (f"for i in $(seq 1 {tries}); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null "
             "&& exit 0; sleep 0.3; done; exit 1")
    return f"bash -c {shlex.quote(probe)}"


@dataclass(frozen=True, kw_only=True)
class SshHead(HeadAccess):
    """The head behind an SSH login: infra/core/remote_head.py's SFTP, commands and daemons."""

    target: ssh.SshTarget
    #: Where the head's daemons keep their private files (0700), `~/`-relative.
    private_root: str = "~/" + remote_head.PRIVATE_DIR
    #: A service for others listens on every address (the cluster's firewall decides who
    #: reaches it); its daemons may run as the node's users (a head rayfleet set up).
    listen_host: str = "0.0.0.0"
    node_users: bool = True

    @property
    def address(self) -> str:
        return self.target.host

    def head_path(self, path: str) -> str:
        # A remote daemon runs from its user's home: `~/` paths as relative ones.
        return path.removeprefix("~/")

    def gateway_files(self, cluster: str) -> GatewayFiles:
        return rooted(self.private_root)

    def run(self, command: str, timeout: float = 60.0, check: bool = False) -> ssh.Result:
        return ssh.run(self.target, command, timeout=timeout, check=check)

    def run_node(self, module: str, args: str, timeout: float = 60.0,
                 check: bool = False) -> ssh.Result:
        """The node package goes up first (SFTP; the head may have none of this checkout's)."""
        remote_zip = remote_head.put_files(self.target)
        return self.run(remote_head.node_command(module, args, self.python, self.activate,
                                                 remote_zip), timeout, check)

    def fetch(self, path: str, local: Path) -> None:
        client = ssh.connect(self.target)
        try:
            sftp = client.open_sftp()
            sftp.get(self.head_path(path), str(local))
            with contextlib.suppress(OSError):
                sftp.remove(self.head_path(path))
            sftp.close()
        finally:
            client.close()

    def put_private(self, files: dict[str, bytes], user: str | None = None) -> None:
        remote_head.put_private(self.target, files, user)

    def read(self, path: str, user: str | None = None) -> str | None:
        return remote_head.read_file(self.target, path, user)

    def tunnels(self, remotes: list[tuple[str, int]]) -> contextlib.AbstractContextManager[list[int]]:
        return ssh.tunnels(self.target, remotes)

    def forward(self, cluster: str, remote: dict[str, int]) -> Forward:
        local, pid, reused = tunnels.open_tunnel(cluster, self.target, remote)
        return Forward(local, pid, reused)

    def ensure_daemon(self, module: str, config_path: str, config_text: str,
                      secrets: dict[str, bytes] | None = None, log: str = "",
                      user: str | None = None, copies: tuple[str, ...] = (),
                      replace: bool = True, wait: bool = True, restart: str = "on-failure") -> bool:
        if not replace:
            _text, status = self.read_with_status(config_path, config_path, user)
            if status is not None and status.get("running"):
                return False
        return remote_head.install_daemon(self.target, module, config_path, config_text, secrets,
                                          python=self.python, activate=self.activate, log=log,
                                          user=user, copies=copies, restart=restart)

    def stop_daemon(self, config_path: str, user: str | None = None) -> None:
        remote_head.stop_daemon(self.target, config_path, self.python, self.activate, user)

    def read_with_status(self, path: str, config_path: str, user: str | None = None,
                         ) -> tuple[str | None, dict[str, Any] | None]:
        return remote_head.read_with_status(self.target, path, config_path, self.python,
                                            self.activate, user)

    def answers(self, port: int, timeout: float) -> bool:
        from infra.core.errors import RayfleetError

        try:
            return self.run(_probe(port, timeout), timeout=timeout + 30).ok
        except RayfleetError:
            return False

    def shell_argv(self, command: str | None = None) -> list[str]:
        tty = ["-t"] if command is None and sys.stdin.isatty() else []
        argv = ["ssh", *ssh.openssh_options(self.target), *tty,
                f"{self.target.user}@{self.target.host}"]
        # A leading ~/ is left to the remote shell's $HOME (the head's home, not ours).
        exports = " ".join(f"{k}={home_path(v)}" for k, v in self.env.items())
        line = 'exec "${SHELL:-bash}" -l' if command is None else command
        # ssh hands the rest to the remote user's shell as one line, the command exactly as typed.
        return [*argv, "--", f"export {exports}; {line}" if exports else line]

    @contextlib.contextmanager
    def rsync_target(self) -> Iterator[tuple[list[str], str]]:
        with _config_file(self.target) as config:
            yield ["-e", f"ssh -F {shlex.quote(str(config))}"], f"{self.target.host}:"


def ssh_head(target: ssh.SshTarget, python: str = "python3", activate: str = "") -> SshHead:
    """The `SshHead` of `target` for the providers' own setup steps (no cluster env needed)."""
    return SshHead(target=target, where=str(target), python=python, activate=activate)


# --- ssh's options for tools that take an ssh command as one string ----------------------------


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


@contextlib.contextmanager
def _config_file(target: ssh.SshTarget) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rayfleet-ssh-") as folder:
        path = Path(folder) / "config"
        atomic_write(path, ssh_config(target), mode=0o600)  # ssh refuses one others can write
        yield path


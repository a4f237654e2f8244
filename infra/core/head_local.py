"""`LocalHead`: a cluster's head that is this machine (the local provider, a Slurm head whose
node is this one): the `HeadAccess` of infra/core/head_access.py over this machine's files,
processes and `infra.node.supervise` daemons."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.core import paths, remote_head, ssh, ui
from infra.core.head_access import Forward, GatewayFiles, HeadAccess, checked
from infra.core.sharing import certs as sharing_certs
from infra.node import gateway_config, rayproc, shell, supervise
from infra.node.files import atomic_write
from infra.node.wait import WaitTimeout, until


@dataclass(frozen=True, kw_only=True)
class LocalHead(HeadAccess):
    """The head is this machine: its files are ours, its daemons our supervised processes."""

    address = "127.0.0.1"
    listen_host = "127.0.0.1"
    node_users = False

    def head_path(self, path: str) -> str:
        return os.path.expanduser(path)

    def gateway_files(self, cluster: str) -> GatewayFiles:
        """The owner's own sharing folder is the gateway's data dir (a registry change reaches it
        at its next request), its certificate the one `sharing_certs` keeps here."""
        folder = paths.home() / "sharing" / cluster
        cert, key = sharing_certs.server_paths(cluster)
        return GatewayFiles(str(folder / gateway_config.CONFIG_FILE), str(folder), str(cert),
                            str(key), str(paths.home() / "logs" / cluster / "gateway.log"))

    def _env(self) -> dict[str, str]:
        return {**os.environ, **{k: os.path.expanduser(v) for k, v in self.env.items()}}

    def run(self, command: str, timeout: float = 60.0, check: bool = False) -> ssh.Result:
        try:
            result = self.bash(command, timeout)
        except subprocess.TimeoutExpired:
            result = ssh.Result(124, "", f"timed out after {timeout:.0f}s")
        return checked(result, command, self.where) if check else result

    def bash(self, command: str, timeout: float, input: str | None = None) -> ssh.Result:
        """`command` in bash here, in the head's environment, `input` on its stdin: every shell
        command rayfleet runs on this machine (Slurm's client commands too). Raises
        subprocess.TimeoutExpired when it takes longer than `timeout`; the caller says what that
        means."""
        done = subprocess.run(["bash", "-c", command], input=input, capture_output=True,
                              text=True, timeout=timeout, env=self._env(), check=False)
        return ssh.Result(done.returncode, done.stdout, done.stderr)

    def run_node(self, module: str, args: str, timeout: float = 60.0,
                 check: bool = False) -> ssh.Result:
        return self.run(shell.all_of(shell.argv("cd", str(paths.PROJECT_ROOT)),
                                     f"{shell.argv(sys.executable, '-m', module)} {args}"),
                        timeout, check)

    def fetch(self, path: str, local: Path) -> None:
        os.replace(self.head_path(path), local)

    def put_private(self, files: dict[str, bytes], user: str | None = None) -> None:
        """A file that already holds these bytes is left alone: here the owner's own copy (the
        registry, the certificate) may be the very file the head's daemon reads."""
        for path, data in files.items():
            local = Path(self.head_path(path))
            with contextlib.suppress(OSError):
                if local.read_bytes() == data:
                    continue
            local.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            atomic_write(local, data, mode=0o600)

    def read(self, path: str, user: str | None = None) -> str | None:
        with contextlib.suppress(OSError):
            return Path(self.head_path(path)).read_text() or None
        return None

    @contextlib.contextmanager
    def tunnels(self, remotes: list[tuple[str, int]]) -> Iterator[list[int]]:
        yield [port for _host, port in remotes]

    def forward(self, cluster: str, remote: dict[str, int]) -> Forward:
        return Forward(dict(remote))

    def ensure_daemon(self, module: str, config_path: str, config_text: str,
                      secrets: dict[str, bytes] | None = None, log: str = "",
                      user: str | None = None, copies: tuple[str, ...] = (),
                      replace: bool = True, wait: bool = True, restart: str = "on-failure") -> bool:
        """The supervisor is `infra.node.supervise.ensure`, run from this checkout."""
        config = Path(self.head_path(config_path))
        pidfile = Path(remote_head.pidfile(str(config)))
        self.put_private(secrets or {})
        with contextlib.suppress(OSError):
            if supervise.running(pidfile) and (not replace or config.read_text() == config_text):
                return False
        supervise.stop(pidfile)  # a daemon keeps the config it started with
        config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(config, config_text, mode=0o600)
        return supervise.ensure([sys.executable, "-m", module, "--config", str(config)], pidfile,
                                Path(self.head_path(log or f"{config_path}.log")),
                                cwd=str(paths.PROJECT_ROOT), wait=wait, restart=restart)

    def stop_daemon(self, config_path: str, user: str | None = None) -> None:
        """Its config stays: the next `ensure_daemon` compares against it."""
        supervise.stop(Path(remote_head.pidfile(self.head_path(config_path))))

    def read_with_status(self, path: str, config_path: str, user: str | None = None,
                         ) -> tuple[str | None, dict[str, Any] | None]:
        pidfile = Path(remote_head.pidfile(self.head_path(config_path)))
        return self.read(path), supervise.status(pidfile)

    def answers(self, port: int, timeout: float) -> bool:
        try:
            return until(lambda: rayproc.port_answers("127.0.0.1", port) or None, timeout, 0.3,
                         f"port {port}")
        except WaitTimeout:
            return False

    def shell_argv(self, command: str | None = None) -> list[str]:
        if command is None:
            return [os.environ.get("SHELL") or "bash"]
        return ["bash", "-c", command]

    def shell_env(self) -> dict[str, str]:
        return self._env()

    def attach(self, command: str | None = None, cluster: str = "") -> int:
        if command is None:
            ui.info(f"a shell in cluster {cluster!r}'s Ray environment (exit to leave)")
        return super().attach(command, cluster)

    @contextlib.contextmanager
    def rsync_target(self) -> Iterator[tuple[list[str], str]]:
        yield [], ""



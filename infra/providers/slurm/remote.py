"""Running Slurm's commands where the spec says: on this machine, or on a login host over SSH.

Both runners take one shell command line and return `infra.core.ssh.Result`: the local one runs it
in bash here through `LocalHead.bash` (infra/core/head.py), the SSH one keeps one paramiko
connection for all commands of a verb (polling `squeue` every fraction of a second must not pay a
handshake each time; `ssh.execute`, as `ssh.run`). A compute node is reached as a head is
(`Runner.node`: a `LocalHead` or an `SshHead`, through the login host when it is remote).
"""

from __future__ import annotations

import abc
import contextlib
import getpass
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.core import ssh
from infra.core.errors import UsageError
from infra.core.head import HeadAccess, LocalHead
from infra.core.head_ssh import SshHead
from infra.node import net
from infra.node.slurm.queue import SlurmError
from infra.providers.slurm.spec import Submit

if TYPE_CHECKING:
    import paramiko


class Runner(abc.ABC):
    """Runs shell command lines next to Slurm's client commands."""

    #: For messages: "this machine" or "user@login".
    where: str

    @abc.abstractmethod
    def run(self, command: str, input: str | None = None, timeout: float = 60) -> ssh.Result:
        """Run `command` in a shell; never raises on a non-zero exit (callers decide)."""

    def check(self, command: str, input: str | None = None, timeout: float = 60) -> str:
        """Run `command` and return its stdout; SlurmError with its last stderr line on failure."""
        result = self.run(command, input=input, timeout=timeout)
        if not result.ok:
            lines = (result.stderr.strip() or result.stdout.strip()).splitlines() or ["no output"]
            raise SlurmError(f"`{command.split()[0]}` on {self.where} exited {result.exit_code}: "
                             f"{lines[-1].strip()}{self._fix(result)}")
        return result.stdout

    def _fix(self, result: ssh.Result) -> str:
        """The usual fix for the two ways a machine without Slurm answers."""
        if result.exit_code == 127:
            return (f"; Slurm's client commands are not installed on {self.where}: install them "
                    "or set submit.host to your cluster's login host")
        if "configuration source" in result.stderr or "configuration file" in result.stderr:
            return (f"; {self.where} has no Slurm configuration: set submit.slurm_conf "
                    "or submit.host to your cluster's login host")
        return ""

    @abc.abstractmethod
    def node_target(self, node: str) -> ssh.SshTarget | None:
        """How to log into the compute node `node` (the endpoint's tunnels, `node`); None when
        the node is this machine."""

    def node(self, node: str, **record: Any) -> HeadAccess:
        """The compute node `node` as infra/core/head.py reaches a head: this machine
        (`LocalHead`) or an SSH login into it, through the login host if remote (`SshHead`), as
        the endpoint's tunnels go. `record`: the access's fields (its environment, ports...)."""
        target = self.node_target(node)
        if target is None:
            return LocalHead(where="this machine", **record)
        return SshHead(target=target, where=str(target), **record)

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""


class LocalRunner(Runner):
    def __init__(self, slurm_conf: str | None, submit: Submit | None = None) -> None:
        self.where = "this machine"
        self._submit = submit or Submit()
        # Slurm's commands run where a head on this machine runs its own (LocalHead).
        self._here = LocalHead(where=self.where,
                               env={"SLURM_CONF": slurm_conf} if slurm_conf else {})

    def run(self, command: str, input: str | None = None, timeout: float = 60) -> ssh.Result:
        try:
            return self._here.bash(command, timeout, input)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"`{command.split()[0]}` on {self.where} took over {timeout:.0f}s; "
                             "is slurmctld answering? (try `sinfo`)") from None

    def node_target(self, node: str) -> ssh.SshTarget | None:
        if net.is_loopback(node) or node in _own_addresses():
            return None  # the node is this machine (a single-node Slurm here)
        # This machine submits, so it is on the cluster's network: SSH into the node directly.
        return ssh.SshTarget(host=node, user=getpass.getuser(), key_path=_default_key(),
                             **_host_keys(self._submit))

    def close(self) -> None:
        """Nothing to release: every command is its own process."""


class SshRunner(Runner):
    def __init__(self, target: ssh.SshTarget, slurm_conf: str | None, login_shell: bool,
                 submit: Submit) -> None:
        self.target = target
        self._submit = submit
        self.where = str(target)
        self._prefix = f"export SLURM_CONF={shlex.quote(slurm_conf)}; " if slurm_conf else ""
        self._login_shell = login_shell
        self._client: paramiko.SSHClient | None = None

    def _connected(self) -> paramiko.SSHClient:
        if self._client is None:
            self._client = ssh.connect(self.target)
        return self._client

    def run(self, command: str, input: str | None = None, timeout: float = 60) -> ssh.Result:
        line = self._prefix + command
        if self._login_shell:
            line = "bash -lc " + shlex.quote(line)
        for attempt in (1, 2):
            try:
                return self._exec(line, input, timeout)
            except ssh.SshError as exc:
                raise SlurmError(str(exc)) from None
            except Exception as exc:  # a dropped connection (a long queue wait): reconnect once
                self.close()
                if attempt == 2:
                    raise SlurmError(f"ssh {self.target}: `{command.split()[0]}` failed: "
                                     f"{str(exc) or type(exc).__name__}") from None
        raise AssertionError("unreachable")

    def _exec(self, line: str, input: str | None, timeout: float) -> ssh.Result:
        return ssh.execute(self._connected(), line, timeout, input)

    def node_target(self, node: str) -> ssh.SshTarget:
        # Into the compute node through the login host (what `ssh -J login node` does), with
        # the login host's user and key.
        return ssh.SshTarget(host=node, user=self.target.user, key_path=self.target.key_path,
                             proxy_command=via(self.target), **_host_keys(self._submit))

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None


def _default_key() -> Path:
    for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
        candidate = Path.home() / ".ssh" / name
        if candidate.exists():
            return candidate
    raise UsageError("submit.key: no key given and no ~/.ssh/id_ed25519, id_ecdsa or id_rsa "
                     "exists; set submit.key to your private key for the login host")


def _own_addresses() -> set[str]:
    import socket

    with contextlib.suppress(OSError):
        return {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    return set()


def _host_keys(submit: Submit) -> dict[str, Any]:
    """Configured hosts (login, jump, compute nodes) are checked strictly against the user's
    known_hosts, or the file the spec names (`submit.known_hosts`)."""
    known = Path(os.path.expanduser(submit.known_hosts)) if submit.known_hosts else None
    return {"known_hosts": known, "host_key_policy": submit.host_key_policy}


def via(target: ssh.SshTarget) -> str:
    """An OpenSSH ProxyCommand that reaches %h:%p through `target` (`ssh -W`, its key, options
    and own proxy). `%` in its options is doubled: the outer ssh expands %h/%p/%% once, so a
    nested ProxyCommand keeps its own %h/%p for the inner ssh."""
    options = [option.replace("%", "%%") for option in ssh.openssh_options(target)]
    return shlex.join(["ssh", "-W", "%h:%p", *options, f"{target.user}@{target.host}"])


def _jump_proxy(jump: str, key: Path, submit: Submit) -> str:
    """An OpenSSH ProxyCommand through a jump host (`ssh -W`), with the same key and options."""
    user, _, rest = jump.rpartition("@")
    host, _, port = rest.partition(":")
    target = ssh.SshTarget(host=host, user=user or getpass.getuser(), key_path=key,
                           port=int(port or 22), **_host_keys(submit))
    return via(target)


def ssh_target(submit: Submit) -> ssh.SshTarget:
    key = Path(os.path.expanduser(submit.key)) if submit.key else _default_key()
    if not key.is_file():
        raise UsageError(f"submit.key: {key} is not a file; point it at your private key")
    proxy = submit.proxy_command or (
        _jump_proxy(submit.jump_host, key, submit) if submit.jump_host else None)
    return ssh.SshTarget(host=submit.host, user=submit.user or getpass.getuser(), key_path=key,
                         port=submit.port, proxy_command=proxy, **_host_keys(submit))


def make_runner(submit: Submit) -> Runner:
    if submit.is_local:
        return LocalRunner(submit.slurm_conf, submit)
    return SshRunner(ssh_target(submit), submit.slurm_conf, submit.login_shell, submit)


@contextlib.contextmanager
def opened(submit: Submit) -> Iterator[Runner]:
    runner = make_runner(submit)
    try:
        yield runner
    finally:
        runner.close()


def describe(submit: Submit) -> str:
    """Where commands run, for plans and messages (no key paths: they are nobody's business)."""
    if submit.is_local:
        return "this machine"
    via = f" via {submit.jump_host}" if submit.jump_host else (
        " via a proxy command" if submit.proxy_command else "")
    return f"{submit.user or getpass.getuser()}@{submit.host}{via}"

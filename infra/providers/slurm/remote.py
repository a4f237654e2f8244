"""Running Slurm's commands where the spec says: on this machine, or on a login host over SSH.

Both runners take one shell command line and return `infra.ssh.Result`. The SSH runner keeps one
paramiko connection for all commands of a verb (polling `squeue` every fraction of a second must
not pay a handshake each time) and tunnels with `infra.ssh.tunnel`.
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
from typing import TYPE_CHECKING

from infra import ssh
from infra.errors import ProviderError, UsageError
from infra.providers.slurm.spec import Submit

if TYPE_CHECKING:
    import paramiko


class SlurmError(ProviderError):
    """A Slurm command failed or the job did not come up; `job_id` when one is concerned."""

    def __init__(self, message: str, job_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


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
    def tunnel(self, host: str, port: int) -> contextlib.AbstractContextManager[str]:
        """Yield a base URL on this machine that reaches host:port (as the nodes see it)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""


class LocalRunner(Runner):
    def __init__(self, slurm_conf: str | None) -> None:
        self.where = "this machine"
        self._env = dict(os.environ)
        if slurm_conf:
            self._env["SLURM_CONF"] = os.path.expanduser(slurm_conf)

    def run(self, command: str, input: str | None = None, timeout: float = 60) -> ssh.Result:
        try:
            done = subprocess.run(["bash", "-c", command], input=input, capture_output=True,
                                  text=True, timeout=timeout, env=self._env, check=False)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"`{command.split()[0]}` on {self.where} took over {timeout:.0f}s; "
                             "is slurmctld answering? (try `sinfo`)") from None
        return ssh.Result(done.returncode, done.stdout, done.stderr)

    @contextlib.contextmanager
    def tunnel(self, host: str, port: int) -> Iterator[str]:
        # This machine submits, so it is on the cluster's network: the head answers directly.
        yield f"http://{host}:{port}"

    def close(self) -> None:
        """Nothing to release: every command is its own process."""


class SshRunner(Runner):
    def __init__(self, target: ssh.SshTarget, slurm_conf: str | None, login_shell: bool) -> None:
        self.target = target
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
        stdin, stdout, stderr = self._connected().exec_command(line, timeout=timeout)
        if input is not None:
            stdin.write(input)
        stdin.channel.shutdown_write()
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return ssh.Result(stdout.channel.recv_exit_status(), out, err)

    @contextlib.contextmanager
    def tunnel(self, host: str, port: int) -> Iterator[str]:
        with ssh.tunnel(self.target, port, remote_host=host) as local_port:
            yield f"http://127.0.0.1:{local_port}"

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


def _jump_proxy(jump: str, key: Path) -> str:
    """An OpenSSH ProxyCommand through a jump host (`ssh -W`), with the same key and options."""
    user, _, rest = jump.rpartition("@")
    host, _, port = rest.partition(":")
    target = ssh.SshTarget(host=host, user=user or getpass.getuser(), key_path=key,
                           port=int(port or 22))
    return shlex.join(["ssh", "-W", "%h:%p", *ssh.openssh_options(target),
                       f"{target.user}@{target.host}"])


def ssh_target(submit: Submit) -> ssh.SshTarget:
    key = Path(os.path.expanduser(submit.key)) if submit.key else _default_key()
    if not key.is_file():
        raise UsageError(f"submit.key: {key} is not a file; point it at your private key")
    proxy = submit.proxy_command or (_jump_proxy(submit.jump_host, key) if submit.jump_host else None)
    return ssh.SshTarget(host=submit.host, user=submit.user or getpass.getuser(), key_path=key,
                         port=submit.port, proxy_command=proxy)


def make_runner(submit: Submit) -> Runner:
    if submit.is_local:
        return LocalRunner(submit.slurm_conf)
    return SshRunner(ssh_target(submit), submit.slurm_conf, submit.login_shell)


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

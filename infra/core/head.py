"""A cluster's head, one interface for every way this machine reaches it (`HeadAccess`).

Each provider says how its head is reached (`Provider.head_access`) by returning one of three
implementations, and nothing above it asks again where the head is:

- `LocalHead`: the head is this machine (the local provider): commands run here in the cluster's
  environment, files are this machine's, daemons start under `infra.node.supervise.ensure`.
- `SshHead` (infra/core/head_ssh.py): the head is behind an SSH login (Lambda, GCP, a Slurm compute
  node): commands over SSH, files over SFTP (infra/core/remote_head.py), daemons through
  `remote_head.install_daemon`, tunnels through `ssh.start_tunnel`, with the same target, key,
  proxy and host-key rules as every other SSH rayfleet does there.
- `SharedFsHead`: the head's daemons are started by the head's own batch job from files on the
  site's shared file system (Slurm): files go there through the node (one of the two above),
  and "ensure a daemon" means putting its config where the job's supervisor starts it.

Every path given to these methods is `~/`-relative (the head user's home) or absolute. This module
also turns an access into `ssh`/`rsync` command lines for `invoke ssh|exec|sync`; it knows no
provider.
"""

from __future__ import annotations

import abc
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from infra.core import paths, remote_head, ssh, ui
from infra.core.errors import UsageError
from infra.core.sharing import certs as sharing_certs
from infra.node import gateway_config, rayproc, shell, supervise
from infra.node.files import atomic_write
from infra.node.tracking import NODE_PASSWORD_PATH
from infra.node.wait import WaitTimeout, until

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


def _checked(result: ssh.Result, command: str, where: str) -> ssh.Result:
    if not result.ok:
        from infra.core.errors import RayfleetError

        last = (result.stderr.strip() or result.stdout.strip()).splitlines() or ["no output"]
        raise RayfleetError(f"`{command.split()[0] if command.split() else command}` on {where} "
                            f"exited {result.exit_code}: {last[-1].strip()}")
    return result


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
        return _checked(result, command, self.where) if check else result

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


def rooted(root: str) -> GatewayFiles:
    return GatewayFiles(f"{root}/{gateway_config.CONFIG_FILE}", f"{root}/gateway",
                        f"{root}/gateway.pem", f"{root}/gateway.key", f"{root}/gateway.log")


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

"""SSH for every provider that reaches its nodes over SSH (Lambda, GCP TPU, Slurm login nodes).

Four small tools, all generic (no provider knowledge):

- `ensure_keypair(cluster)`: an ed25519 key pair under `paths.keys_dir(cluster)`, private key 0600
  in a 0700 folder, created once and reused. Only the public half ever leaves this machine.
- `probe(target)` / `wait_until_ready(targets)`: does a real SSH login (handshake + key auth) work?
  A TCP port that answers is not enough: sshd accepts connections before cloud-init installed keys.
- `run(target, command)`: one remote command through paramiko, with exit code and output.
- `tunnel(target, remote_port)`: an OpenSSH `ssh -N -L` subprocess forwarding a free local port,
  for as long as the `with` block lasts (`invoke dashboard`, `invoke submit`); `tunnels` forwards
  several ports through one such process (one login). Both, and the detached tunnel of
  infra/core/tunnels.py, start it through `start_tunnel`.

Every function takes an `SshTarget`, which carries an optional ProxyCommand (`%h`/`%p` expanded as
OpenSSH does), so users behind a bastion and the test bed (hosts reached through a network
namespace) work the same way. paramiko is imported inside functions: importing this module is cheap.

Host keys: nodes are freshly created machines whose host keys we cannot know in advance, so a
cluster's instances are accepted on first contact and pinned from then on in the cluster's own
known_hosts file (`accept-new`). Configured, long-lived hosts (Slurm login nodes, jump hosts) use
the user's normal known_hosts and must already be in it (`strict`). A changed key is an error naming
the host, never silently accepted: paramiko and OpenSSH follow the same rules (`openssh_options`).
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from infra.core import paths
from infra.core.errors import RayfleetError
from infra.node import rayproc, wait
from infra.node.files import atomic_write, write_error

if TYPE_CHECKING:
    import paramiko

KEY_NAME = "id_ed25519"


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
class KeyPair:
    """A key pair rayfleet generated for one cluster."""

    #: The private key file (mode 0600). Its content never goes to logs, state or templates.
    private_path: Path
    #: The public key line, `ssh-ed25519 AAAA... comment`: the only part that is uploaded.
    public_key: str


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


# --- keys -----------------------------------------------------------------------------------------


def ensure_keypair(cluster: str, comment: str | None = None) -> KeyPair:
    """The cluster's ed25519 key pair, generated on first use (private 0600, folder 0700)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder = paths.keys_dir(cluster)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
    except OSError as exc:
        raise write_error(folder, exc) from None
    private_path = folder / KEY_NAME
    public_path = folder / f"{KEY_NAME}.pub"
    label = comment or f"rayfleet-{cluster}"
    if private_path.exists() and private_path.stat().st_size:
        key = serialization.load_ssh_private_key(private_path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise SshError(f"{private_path} is not an ed25519 key; delete it to generate a new one")
        private_path.chmod(0o600)  # repair a loosened mode: ssh refuses keys others can read
    else:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
        # 0600 before any byte is in it: the key is never readable by others, not even for an
        # instant; an empty file (a write that once failed half-way) is replaced, all or nothing.
        atomic_write(private_path, pem, mode=0o600)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    line = f"{public} {label}"
    atomic_write(public_path, line + "\n")
    return KeyPair(private_path, line)


# --- paramiko sessions ----------------------------------------------------------------------------


def expand_proxy(command: str, host: str, port: int, user: str = "") -> str:
    """Expand OpenSSH's `%h`, `%p`, `%r` and `%%` in a ProxyCommand."""
    out, i = [], 0
    while i < len(command):
        if command[i] == "%" and i + 1 < len(command):
            out.append({"h": host, "p": str(port), "r": user, "%": "%"}.get(command[i + 1],
                                                                           command[i:i + 2]))
            i += 2
        else:
            out.append(command[i])
            i += 1
    return "".join(out)


def _known_hosts_path(target: SshTarget) -> Path:
    return target.known_hosts or user_known_hosts()


def _pin(path: Path, host_name: str, key: Any) -> None:
    """Add one host key to a known_hosts file, serialised against parallel probes (a lock file
    beside it) and written whole (the one atomic write: a full disk never truncates the file)."""
    from filelock import FileLock

    path = path.resolve()  # a symlinked known_hosts stays a symlink: its target is replaced
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(path.parent, exc) from None
    with FileLock(f"{path}.lock", mode=0o600):
        try:
            old, mode = path.read_text(), path.stat().st_mode & 0o777
        except FileNotFoundError:
            old, mode = "", 0o600
        if old and not old.endswith("\n"):
            old += "\n"
        atomic_write(path, f"{old}{host_name} {key.get_name()} {key.get_base64()}\n", mode=mode)


def _host_key_policy(target: SshTarget) -> Any:
    import paramiko

    path = _known_hosts_path(target)

    class Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> None:
            if target.host_key_policy != "accept-new":
                raise HostKeyError(
                    f"ssh {target}: host key of {hostname} is not in {path}; check it and add it "
                    f"(e.g. `ssh -o StrictHostKeyChecking=accept-new {target.user}@{target.host}`)"
                )
            # Re-read first: a parallel probe may have pinned this host a moment ago.
            known = paramiko.HostKeys(str(path)) if path.exists() else paramiko.HostKeys()
            pinned = known.lookup(hostname)
            if pinned and key.get_name() in pinned and pinned[key.get_name()] != key:
                raise HostKeyError(_changed(target, hostname, path))
            if not pinned or key.get_name() not in pinned:
                _pin(path, hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)

    return Policy()


def _changed(target: SshTarget, hostname: str, path: Path) -> str:
    return (f"ssh {target}: the host key of {hostname} CHANGED since it was pinned in {path}; "
            "if the host was legitimately replaced, remove its line there, else do not connect")


def connect(target: SshTarget, timeout: float = 10.0) -> paramiko.SSHClient:
    """An authenticated paramiko client for `target`; the caller closes it. Raises SshError."""
    import logging

    import paramiko

    # paramiko logs every failed handshake with a traceback; a node that is still booting is
    # expected, and our caller reports the reason in one line.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    client = paramiko.SSHClient()
    path = _known_hosts_path(target)
    if path.exists():
        client.load_system_host_keys(str(path))  # read-only: we append pins ourselves
    client.set_missing_host_key_policy(_host_key_policy(target))
    sock: Any = None
    if target.proxy_command:
        sock = paramiko.ProxyCommand(
            expand_proxy(target.proxy_command, target.host, target.port, target.user))
    try:
        client.connect(
            target.host, port=target.port, username=target.user, key_filename=str(target.key_path),
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, sock=sock,
            allow_agent=False, look_for_keys=False,
        )
    except Exception as exc:  # socket, paramiko and proxy errors alike mean "not reachable (yet)"
        client.close()
        if sock is not None:
            with contextlib.suppress(Exception):
                sock.close()
        if isinstance(exc, HostKeyError):
            raise
        if isinstance(exc, paramiko.BadHostKeyException):
            raise HostKeyError(_changed(target, exc.hostname, path)) from None
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SshError(f"ssh {target}: {reason}") from None
    return client


def probe(target: SshTarget, timeout: float = 5.0) -> str | None:
    """None when a login succeeds, else the reason it did not (for progress lines)."""
    try:
        connect(target, timeout).close()
    except HostKeyError:
        raise  # waiting longer cannot fix a wrong host key
    except SshError as exc:
        return str(exc)
    return None


def wait_until_ready(targets: Sequence[SshTarget], timeout: float, interval: float = 1.0,
                     on_progress: Callable[[dict[str, str | None]], None] | None = None) -> None:
    """Probe all targets in parallel until every one accepts a login; SshError after `timeout`.

    `on_progress` gets {target: None if ready else last reason} after every round.
    """
    pending = {str(t): t for t in targets}
    last: dict[str, str | None] = dict.fromkeys(pending, "not tried yet")

    def all_ready() -> bool | None:
        nonlocal pending
        reasons = dict(zip(pending, pool.map(probe, pending.values()), strict=True))
        last.update(reasons)
        pending = {name: t for name, t in pending.items() if reasons[name] is not None}
        if on_progress:
            on_progress(dict(last))
        return True if not pending else None

    def refused() -> SshError:
        name, reason = next(iter((n, last[n]) for n in pending))
        return SshError(f"{name} accepted no SSH login within {timeout:.0f}s ({reason})")

    if not pending:
        return
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(targets)))) as pool:
        wait.until(all_ready, timeout, interval, on_timeout=refused)


def execute(client: paramiko.SSHClient, command: str, timeout: float,
            input: str | None = None) -> Result:
    """The one way a command runs over SSH: `command` on an open `client`, `input` (if any) on
    its stdin, stdout and stderr read at the same time. Reading one stream to its end before the
    other would stall a command that fills the other's window (a few MB of warnings on stderr)
    until `timeout`. OSError (socket.timeout included) when it does not finish in time."""
    stdin, stdout, stderr = client.exec_command(command, timeout=timeout)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            # Both readers run before stdin is fed: a command that answers before it has read
            # all its input never waits for us either.
            out, err = pool.submit(stdout.read), pool.submit(stderr.read)
            try:
                if input is not None:
                    stdin.write(input)
                stdin.channel.shutdown_write()  # EOF: a command reading stdin never waits for more
                output, errors = out.result(), err.result()
            except BaseException:
                stdout.channel.close()  # a timeout or a failed write: end both readers now
                raise
        code = stdout.channel.recv_exit_status()
    finally:
        stdout.channel.close()
    return Result(code, output.decode(errors="replace"), errors.decode(errors="replace"))


def run(target: SshTarget, command: str, timeout: float = 120.0, check: bool = False) -> Result:
    """Run a shell command on `target` and collect its output. With `check`, a non-zero exit
    raises SshError naming the host and the last line of stderr."""
    client = connect(target, timeout=min(timeout, 15.0))
    try:
        result = execute(client, command, timeout)
    except OSError as exc:  # socket.timeout included
        raise SshError(f"ssh {target}: `{command[:60]}` did not finish: {exc or 'timeout'}") from None
    finally:
        client.close()
    if check and not result.ok:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise SshError(f"ssh {target}: `{command[:60]}` exited {result.exit_code}: {tail[0]}")
    return result


# --- OpenSSH (tunnels, and option lists for tools that shell out to ssh) --------------------------


def openssh_options(target: SshTarget) -> list[str]:
    """`-o`/`-i`/`-p` options that make the `ssh` client behave like `connect`."""
    checking = "accept-new" if target.host_key_policy == "accept-new" else "yes"
    options = [
        "-i", str(target.key_path), "-p", str(target.port),
        "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", f"StrictHostKeyChecking={checking}",
        "-o", f"UserKnownHostsFile={_known_hosts_path(target)}",
        "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10",
        "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
    ]
    if target.proxy_command:
        options += ["-o", f"ProxyCommand={target.proxy_command}"]
    return options


def _die_with_parent() -> None:
    # The tunnel must not outlive the rayfleet process, even one killed with SIGKILL.
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@contextlib.contextmanager
def tunnel(target: SshTarget, remote_port: int, remote_host: str = "127.0.0.1",
           local_port: int | None = None, timeout: float = 30.0) -> Iterator[int]:
    """Forward 127.0.0.1:<free port> to `remote_host:remote_port` as seen from `target`.

    Yields the local port once the tunnel's own ssh listens there; the ssh process ends with the
    block (and with this process). A port grabbed by someone else between choice and bind is
    never handed out (it answers, but not for us): another is tried.
    """
    with tunnels(target, [(remote_host, remote_port)],
                 [local_port] if local_port else None, timeout) as ports:
        yield ports[0]


@contextlib.contextmanager
def tunnels(target: SshTarget, remotes: list[tuple[str, int]],
            local_ports: list[int] | None = None, timeout: float = 30.0) -> Iterator[list[int]]:
    """Like `tunnel`, for several (host, port) at once through ONE ssh process (one login): the
    local ports, in the order of `remotes`."""
    process, ports = start_tunnel(target, remotes, local_ports, timeout, fixed=bool(local_ports))
    try:
        yield ports
    finally:
        _stop(process)


def start_tunnel(target: SshTarget, remotes: list[tuple[str, int]], local_ports: list[int] | None,
                 timeout: float, *, fixed: bool = False,
                 detached_log: Path | None = None) -> tuple[subprocess.Popen[bytes], list[int]]:
    """rayfleet's one start of an `ssh -N -L` tunnel: (its ssh process, the local ports in the order
    of `remotes`), once that process itself listens on every port.

    `local_ports` are tried first (free ones otherwise). Unless `fixed`, a port someone else took
    between choice and bind is replaced by another free one, twice at most. A host key that
    changed is a HostKeyError naming the known_hosts file. Without `detached_log` the process
    ends with this one (`tunnels`); with it, it lives on in a session of its own, writing its
    errors there (`infra/core/tunnels.py`: a shell's `invoke env`)."""
    attempts = 1 if fixed else 3
    last_error = ""
    for attempt in range(attempts):
        ports = (list(local_ports) if local_ports and attempt == 0
                 else [rayproc.free_port() for _ in remotes])
        forwards = [arg for (host, remote), port in zip(remotes, ports, strict=True)
                    for arg in ("-L", f"127.0.0.1:{port}:{host}:{remote}")]
        command = ["ssh", "-N", *openssh_options(target), "-o", "ExitOnForwardFailure=yes",
                   *forwards, f"{target.user}@{target.host}"]
        process = _popen(command, detached_log)
        with contextlib.suppress(_Ended):
            wait.until(functools.partial(_answering, process, ports), timeout, 0.1, on_timeout=_Ended)
        if process.poll() is None and rayproc.listens_on(process.pid, ports):
            return process, ports
        _stop(process)
        stderr = (detached_log.read_text(errors="replace") if detached_log is not None
                  else process.stderr.read().decode(errors="replace") if process.stderr else "")
        if "IDENTIFICATION HAS CHANGED" in stderr or "Host key verification failed" in stderr:
            raise HostKeyError(_changed(target, target.host, _known_hosts_path(target))
                               if "CHANGED" in stderr else
                               f"ssh {target}: host key verification failed against "
                               f"{_known_hosts_path(target)}")
        last_error = (stderr.strip().splitlines() or ["no answer on the local end"])[-1]
        if "forward" not in last_error.lower() and "address already in use" not in last_error:
            break
    where = ", ".join(f"{host}:{remote}" for host, remote in remotes)
    raise SshError(f"tunnel to {where} via {target} failed: {last_error}; "
                   f"try `ssh {shlex.join(openssh_options(target))} {target.user}@{target.host}`")


def _popen(command: list[str], detached_log: Path | None) -> subprocess.Popen[bytes]:
    if detached_log is None:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    detached_log.parent.mkdir(parents=True, exist_ok=True)
    # A file, not a pipe: the process outlives this one, and a write to a pipe nobody reads
    # any more would end it.
    with detached_log.open("w") as err:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)


class _Ended(Exception):
    """The tunnel's ssh exited, or its ports did not answer in time (the caller says which)."""


def _answering(process: subprocess.Popen[bytes], ports: list[int]) -> bool | None:
    """True once the ssh process itself listens on every port: another process that took one
    between choice and bind answers there too, and ssh then exits (ExitOnForwardFailure)."""
    if process.poll() is not None:
        raise _Ended
    return True if rayproc.listens_on(process.pid, ports) else None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

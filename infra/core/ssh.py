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
  infra/core/tunnels.py, start it through `start_tunnel` (infra/core/ssh_tunnel.py).

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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.core import paths
from infra.core.ssh_target import (
    HostKeyError,
    HostKeyPolicy,
    Result,
    SshError,
    SshTarget,
    changed_key,
    cluster_known_hosts,
    known_hosts_path,
    user_known_hosts,
)
from infra.core.ssh_tunnel import openssh_options, start_tunnel, tunnel, tunnels
from infra.node import wait
from infra.node.files import atomic_write, write_error

if TYPE_CHECKING:
    import paramiko

#: Names callers import from here; the types live in infra/core/ssh_target.py, the OpenSSH
#: tunnels in infra/core/ssh_tunnel.py.
__all__ = ["KEY_NAME", "HostKeyError", "HostKeyPolicy", "KeyPair", "Result", "SshError",
           "SshTarget", "cluster_known_hosts", "connect", "ensure_keypair", "execute",
           "expand_proxy", "known_hosts_path", "openssh_options", "probe", "run", "start_tunnel",
           "tunnel", "tunnels", "user_known_hosts", "wait_until_ready"]

KEY_NAME = "id_ed25519"


@dataclass(frozen=True)
class KeyPair:
    """A key pair rayfleet generated for one cluster."""

    #: The private key file (mode 0600). Its content never goes to logs, state or templates.
    private_path: Path
    #: The public key line, `ssh-ed25519 AAAA... comment`: the only part that is uploaded.
    public_key: str



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

    path = known_hosts_path(target)

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
                raise HostKeyError(changed_key(target, hostname, path))
            if not pinned or key.get_name() not in pinned:
                _pin(path, hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)

    return Policy()


def connect(target: SshTarget, timeout: float = 10.0) -> paramiko.SSHClient:
    """An authenticated paramiko client for `target`; the caller closes it. Raises SshError."""
    import logging

    import paramiko

    # paramiko logs every failed handshake with a traceback; a node that is still booting is
    # expected, and our caller reports the reason in one line.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    client = paramiko.SSHClient()
    path = known_hosts_path(target)
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
            raise HostKeyError(changed_key(target, exc.hostname, path)) from None
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

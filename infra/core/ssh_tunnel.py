"""OpenSSH tunnels: `ssh -N -L` subprocesses forwarding free local ports to a host's ports, for a
`with` block (`tunnel`, `tunnels`) or detached (infra/core/tunnels.py); all start in
`start_tunnel`. `openssh_options` makes any `ssh` command line follow the same key, proxy and
host-key rules as infra/core/ssh.py's paramiko sessions."""

from __future__ import annotations

import contextlib
import functools
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from infra.core.ssh_target import HostKeyError, SshError, SshTarget, changed_key, known_hosts_path
from infra.node import rayproc, wait

# --- OpenSSH (tunnels, and option lists for tools that shell out to ssh) --------------------------


def openssh_options(target: SshTarget) -> list[str]:
    """`-o`/`-i`/`-p` options that make the `ssh` client behave like `connect`."""
    checking = "accept-new" if target.host_key_policy == "accept-new" else "yes"
    options = [
        "-i", str(target.key_path), "-p", str(target.port),
        "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", f"StrictHostKeyChecking={checking}",
        "-o", f"UserKnownHostsFile={known_hosts_path(target)}",
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
            raise HostKeyError(changed_key(target, target.host, known_hosts_path(target))
                               if "CHANGED" in stderr else
                               f"ssh {target}: host key verification failed against "
                               f"{known_hosts_path(target)}")
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

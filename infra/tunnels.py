"""Long-lived SSH tunnels to a cluster's head, for Ray's own tools (`eval "$(invoke env)"`).

`ssh.tunnel` lives as long as one rayfleet command; a shell that evaluated `invoke env` needs its
forwards after rayfleet has exited. So this one runs detached, one per cluster, recorded in
`.rayfleet/tunnels/<cluster>.json` (pid, ports, target). A later `invoke env` reuses it while it
answers; `invoke env --close` and `invoke teardown` end it. Only the process recorded, by pid, start
time and command line (psutil, `rayproc.Identity`), is ever signalled: never one that got its pid
later. The short-lived tunnels of one command are `remote_head.endpoint`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

from infra import paths, ssh
from infra.node import rayproc, wait
from infra.node.files import atomic_write


def record_path(cluster: str) -> Path:
    return paths.home() / "tunnels" / f"{cluster}.json"


def _process(record: dict[str, object]) -> rayproc.psutil.Process | None:
    """The recorded tunnel's process while it runs: the same pid, start time and command line."""
    ident = rayproc.Identity.from_dict(record)
    proc = ident.process() if ident is not None else None
    try:
        return proc if proc is not None and proc.cmdline() == record.get("argv") else None
    except rayproc.psutil.Error:
        return None


def _alive(record: dict[str, object]) -> bool:
    return _process(record) is not None


def _read(cluster: str) -> dict[str, object] | None:
    try:
        data: dict[str, object] = json.loads(record_path(cluster).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


def open_tunnel(cluster: str, target: ssh.SshTarget, remote_ports: dict[str, int],
                timeout: float = 30.0) -> tuple[dict[str, int], int, bool]:
    """Forward a free local port to each of `remote_ports` (name -> port on the head's loopback),
    detached from this process. Returns (name -> local port, pid, reused).

    One tunnel per cluster serves every caller: a running one that already forwards these ports
    is reused; one that lacks some is replaced by one forwarding both sets, on the same local
    ports where they are still free, so a shell that evaluated `invoke env` keeps working after
    `invoke serve-url` added Serve's port."""
    record = _read(cluster)
    if record is not None and _alive(record) and record.get("target") == str(target):
        recorded_remote = {str(k): int(v) for k, v in dict(record["remote"]).items()}  # type: ignore[call-overload]
        ports = {str(k): int(v) for k, v in dict(record["local"]).items()}  # type: ignore[call-overload]
        if (all(recorded_remote.get(k) == v for k, v in remote_ports.items())
                and rayproc.listens_on(int(record["pid"]), list(ports.values()))):  # type: ignore[call-overload]
            return {k: ports[k] for k in remote_ports}, int(record["pid"]), True  # type: ignore[call-overload]
        kept = {k: v for k, v in recorded_remote.items() if k not in remote_ports}
        remote_ports = {**kept, **remote_ports}
        previous = ports
    else:
        previous = {}
    close(cluster)
    local = {name: _reusable(previous.get(name)) for name in remote_ports}
    forwards = [arg for name, port in remote_ports.items()
                for arg in ("-L", f"127.0.0.1:{local[name]}:127.0.0.1:{port}")]
    argv = ["ssh", "-N", *ssh.openssh_options(target), "-o", "ExitOnForwardFailure=yes",
            *forwards, f"{target.user}@{target.host}"]
    log = paths.home() / "logs" / cluster / "tunnel.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as err:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=err, start_new_session=True)
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if rayproc.listens_on(process.pid, list(local.values())):  # its own, not a squatter's
            break
        time.sleep(0.1)
    if process.poll() is not None or time.monotonic() >= deadline:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        reason = (log.read_text().strip().splitlines() or ["no answer on the local end"])[-1]
        raise ssh.SshError(f"tunnel to {target} failed: {reason}")
    path = record_path(cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    ident = rayproc.Identity.of(process.pid)
    atomic_write(path, json.dumps({"pid": process.pid, "argv": argv, "target": str(target),
                                   "create_time": ident.create_time if ident else None,
                                   "remote": remote_ports, "local": local}) + "\n")
    return local, process.pid, False


def _reusable(port: int | None) -> int:
    """`port` again when nothing listens on it (the tunnel it belonged to has just ended), else a
    free one."""
    if port is not None:
        with contextlib.suppress(wait.WaitTimeout):
            return wait.until(lambda: None if rayproc.port_answers("127.0.0.1", port, timeout=0.2)
                              else port, 2.0, 0.1, f"port {port} to be free")
    return rayproc.free_port()


def close(cluster: str) -> bool:
    """End the cluster's tunnel if it runs; True when there was one."""
    record = _read(cluster)
    record_path(cluster).unlink(missing_ok=True)
    proc = _process(record) if record is not None else None
    if proc is None:
        return False
    with contextlib.suppress(rayproc.psutil.Error):
        proc.terminate()  # psutil checks the start time again: never a successor on the pid
    return True

"""Long-lived SSH tunnels to a cluster's head, for Ray's own tools (`eval "$(invoke env)"`).

`ssh.tunnel` lives as long as one rayfleet command; a shell that evaluated `invoke env` needs its
forwards after rayfleet has exited. So this one runs detached, one per cluster, recorded in
`.rayfleet/tunnels/<cluster>.json` (pid, ports, target). A later `invoke env` reuses it while it
answers; `invoke env --close` and `invoke teardown` end it. Only a process whose command line is
the one recorded is ever signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from infra import paths, ssh
from infra.node import rayproc


def record_path(cluster: str) -> Path:
    return paths.home() / "tunnels" / f"{cluster}.json"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _alive(record: dict[str, object]) -> bool:
    pid = record.get("pid")
    return isinstance(pid, int) and _cmdline(pid) == record.get("argv")


def _read(cluster: str) -> dict[str, object] | None:
    try:
        data: dict[str, object] = json.loads(record_path(cluster).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


def open_tunnel(cluster: str, target: ssh.SshTarget, remote_ports: dict[str, int],
                timeout: float = 30.0) -> tuple[dict[str, int], int, bool]:
    """Forward a free local port to each of `remote_ports` (name -> port on the head's loopback),
    detached from this process. Returns (name -> local port, pid, reused)."""
    record = _read(cluster)
    if (record is not None and _alive(record) and record.get("target") == str(target)
            and record.get("remote") == remote_ports):
        ports = {str(k): int(v) for k, v in dict(record["local"]).items()}  # type: ignore[call-overload]
        if all(rayproc.port_answers("127.0.0.1", p) for p in ports.values()):
            return ports, int(record["pid"]), True  # type: ignore[call-overload]
    close(cluster)
    local = {name: rayproc.free_port() for name in remote_ports}
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
        if all(rayproc.port_answers("127.0.0.1", p, timeout=0.3) for p in local.values()):
            break
        time.sleep(0.1)
    if process.poll() is not None or time.monotonic() >= deadline:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        reason = (log.read_text().strip().splitlines() or ["no answer on the local end"])[-1]
        raise ssh.SshError(f"tunnel to {target} failed: {reason}")
    path = record_path(cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": process.pid, "argv": argv, "target": str(target),
                                "remote": remote_ports, "local": local}) + "\n")
    return local, process.pid, False


def close(cluster: str) -> bool:
    """End the cluster's tunnel if it runs; True when there was one."""
    record = _read(cluster)
    record_path(cluster).unlink(missing_ok=True)
    if record is None or not _alive(record):
        return False
    pid = int(record["pid"])  # type: ignore[call-overload]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    return True

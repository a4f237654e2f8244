"""Long-lived SSH tunnels to a cluster's head, for Ray's own tools (`eval "$(invoke env)"`).

`ssh.tunnel` lives as long as one rayfleet command; a shell that evaluated `invoke env` needs its
forwards after rayfleet has exited. So this one runs detached, one per cluster (started by
`ssh.start_tunnel`, as every tunnel is), recorded in `.rayfleet/tunnels/<cluster>.json` (`Record`:
pid, ports, target). A later `invoke env` reuses it while it
answers; `invoke env --close` and `invoke teardown` end it. Only the process recorded, by pid, start
time and command line (psutil, `rayproc.Identity`), is ever signalled: never one that got its pid
later. The short-lived tunnels of one command are `remote_head.endpoint`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.core import paths, ssh
from infra.node import rayproc, wait
from infra.node.files import atomic_write


@dataclass(frozen=True)
class Record:
    """What `.rayfleet/tunnels/<cluster>.json` holds about a cluster's detached tunnel."""

    pid: int
    argv: list[str]
    target: str
    create_time: float | None
    remote: dict[str, int] = field(default_factory=dict)  # name -> port on the head's loopback
    local: dict[str, int] = field(default_factory=dict)  # name -> port here

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """The record of a file this or an earlier rayfleet wrote; ValueError (KeyError,
        TypeError) when it is not one."""
        create_time = data.get("create_time")
        return cls(pid=int(data["pid"]), argv=[str(a) for a in data["argv"]],
                   target=str(data["target"]),
                   create_time=None if create_time is None else float(create_time),
                   remote={str(k): int(v) for k, v in dict(data.get("remote") or {}).items()},
                   local={str(k): int(v) for k, v in dict(data.get("local") or {}).items()})


def record_path(cluster: str) -> Path:
    return paths.home() / "tunnels" / f"{cluster}.json"


def _process(record: Record) -> rayproc.psutil.Process | None:
    """The recorded tunnel's process while it runs: the same pid, start time and command line."""
    if record.create_time is None:
        return None  # a pid without its start time proves nothing
    proc = rayproc.Identity(record.pid, record.create_time).process()
    try:
        return proc if proc is not None and proc.cmdline() == record.argv else None
    except rayproc.psutil.Error:
        return None


def read_record(cluster: str) -> Record | None:
    try:
        return Record.from_dict(json.loads(record_path(cluster).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def open_tunnel(cluster: str, target: ssh.SshTarget, remote_ports: dict[str, int],
                timeout: float = 30.0) -> tuple[dict[str, int], int, bool]:
    """Forward a free local port to each of `remote_ports` (name -> port on the head's loopback),
    detached from this process. Returns (name -> local port, pid, reused).

    One tunnel per cluster serves every caller: a running one that already forwards these ports
    is reused; one that lacks some is replaced by one forwarding both sets, on the same local
    ports where they are still free, so a shell that evaluated `invoke env` keeps working after
    `invoke serve-url` added Serve's port."""
    record = read_record(cluster)
    previous: dict[str, int] = {}
    if record is not None and _process(record) is not None and record.target == str(target):
        if (all(record.remote.get(k) == v for k, v in remote_ports.items())
                and rayproc.listens_on(record.pid, list(record.local.values()))):
            return {k: record.local[k] for k in remote_ports}, record.pid, True
        remote_ports = {**{k: v for k, v in record.remote.items() if k not in remote_ports},
                        **remote_ports}
        previous = record.local
    close(cluster)
    names = list(remote_ports)
    process, ports = ssh.start_tunnel(
        target, [("127.0.0.1", remote_ports[name]) for name in names],
        [_reusable(previous.get(name)) for name in names], timeout,
        detached_log=paths.home() / "logs" / cluster / "tunnel.log")
    local = dict(zip(names, ports, strict=True))
    ident = rayproc.Identity.of(process.pid)
    path = record_path(cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = process.args if isinstance(process.args, list) else [process.args]
    atomic_write(path, json.dumps(asdict(Record(
        pid=process.pid, argv=[str(a) for a in argv], target=str(target),
        create_time=ident.create_time if ident else None, remote=remote_ports, local=local))) + "\n")
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
    record = read_record(cluster)
    record_path(cluster).unlink(missing_ok=True)
    proc = _process(record) if record is not None else None
    if proc is None:
        return False
    with contextlib.suppress(rayproc.psutil.Error):
        proc.terminate()  # psutil checks the start time again: never a successor on the pid
    return True

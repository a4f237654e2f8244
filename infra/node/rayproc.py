"""Starting and stopping one Ray node's processes without touching any other Ray on the machine.

`ray stop` kills every Ray process of the user. rayfleet instead finds a cluster's processes by
what their command lines name (its private temp dir, its GCS address), adds their descendants
(workers rename themselves `ray::IDLE`, so only ancestry identifies them), and signals exactly those.
The standard library and psutil only (Ray's own copy of it on Slurm's nodes, see below).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    import psutil
except ModuleNotFoundError:
    # Slurm's nodes run this file (embedded by slurm/node_helper.py) with the Python that runs
    # Ray, without importing Ray (slow). Ray ships psutil in ray/thirdparty_files and puts that
    # on sys.path when imported; do the same without the import.
    _ray = importlib.util.find_spec("ray")
    if _ray is None or not _ray.submodule_search_locations:
        raise
    sys.path.append(os.path.join(next(iter(_ray.submodule_search_locations)), "thirdparty_files"))
    import psutil

from infra.node.wait import WaitTimeout, until

#: The port flags of `ray start`, in block order: a cluster that must not collide with another
#: Ray on the same machine sets every one of them.
PORT_NAMES = (
    "port",
    "dashboard-port",
    "ray-client-server-port",
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)
WORKER_PORTS = 100
#: Ports a block spans: the named ports, a gap, then the worker port range.
BLOCK_SIZE = 16 + WORKER_PORTS


@dataclass(frozen=True)
class PortBlock:
    """All ports of one Ray node, consecutive from `base`, so clusters never collide."""

    base: int

    @property
    def gcs(self) -> int:
        return self.base

    @property
    def dashboard(self) -> int:
        return self.base + 1

    # The gap between the named ports and the worker range holds the cluster's own services.
    @property
    def tracking(self) -> int:
        """The MLflow tracking server (`tracking: mlflow`)."""
        return self.base + len(PORT_NAMES)

    @property
    def serve_http(self) -> int:
        """Ray Serve's HTTP proxy (`invoke serve deploy`)."""
        return self.base + len(PORT_NAMES) + 1

    @property
    def prometheus(self) -> int:
        """The cluster's Prometheus (`metrics: prometheus`)."""
        return self.base + len(PORT_NAMES) + 2

    @property
    def autoscaler_metrics(self) -> int:
        """Ray's autoscaler and dashboard export their metrics on fixed ports (44217, 44227)
        unless told otherwise: two clusters on one machine would share them."""
        return self.base + len(PORT_NAMES) + 3

    @property
    def dashboard_metrics(self) -> int:
        return self.base + len(PORT_NAMES) + 4

    def flags(self) -> list[str]:
        named = [f"--{name}={self.base + i}" for i, name in enumerate(PORT_NAMES)]
        first_worker = self.base + 16
        return [
            *named,
            f"--min-worker-port={first_worker}",
            f"--max-worker-port={first_worker + WORKER_PORTS - 1}",
        ]

    def all_ports(self) -> list[int]:
        return list(range(self.base, self.base + len(PORT_NAMES))) + list(
            range(self.base + 16, self.base + 16 + WORKER_PORTS)
        )


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def block_is_free(block: PortBlock) -> bool:
    # Ray binds most ports on all interfaces, so check the wildcard address.
    return all(port_is_free(p, "0.0.0.0") for p in block.all_ports())


def free_port() -> int:
    """A port the kernel says is free now (for tunnels' local ends)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listens_on(pid: int, ports: Sequence[int]) -> bool:
    """True when process `pid` itself listens on every one of `ports`. A port chosen free, then
    handed to a tunnel's ssh, may be taken by another process first (any bind to port 0 on this
    machine may pick it): that port answers too, but not for us, and a tunnel must never send a
    cluster's token there."""
    try:
        proc = psutil.Process(pid)
        # net_connections since psutil 6; Ray's bundled copy may be older.
        listing = getattr(proc, "net_connections", None) or proc.connections
        mine = {c.laddr.port for c in listing(kind="tcp") if c.status == psutil.CONN_LISTEN}
    except psutil.Error:
        return False
    return set(ports) <= mine


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def cmdline(pid: int) -> str:
    """A process's command line, words joined by spaces; "" when there is no such process (or
    it is not ours to read)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _net_namespace(pid: int | str) -> str:
    # psutil has no view of namespaces; the link's target names the network namespace.
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def gcs_marker(gcs_port: int) -> re.Pattern[str]:
    """Matches processes that name the cluster's GCS (the Ray client server does, and only that)."""
    return re.compile(rf"--(?:gcs-)?address=[\w.:-]*:{gcs_port}(?!\d)")


def cluster_processes(markers: list[str | re.Pattern[str]]) -> list[int]:
    """PIDs whose command line contains any marker, plus all their descendants."""
    me = os.getpid()
    # A port (and so the GCS marker) names a cluster only within this network namespace: the
    # Ray of a container or test-bed host on the same port is someone else's.
    here = _net_namespace("self")

    def ours(proc: psutil.Process) -> bool:
        return proc.pid != me and _net_namespace(proc.pid) in ("", here)

    found: set[int] = set()
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if not ours(proc) or not any(contains(line, m) for m in markers):
            continue
        found.add(proc.pid)
        with contextlib.suppress(psutil.Error):  # it ended meanwhile: no descendants either
            found |= {child.pid for child in proc.children(recursive=True) if ours(child)}
    return sorted(found)


def contains(line: str, marker: str | re.Pattern[str]) -> bool:
    """Marker match that respects boundaries: /tmp/x must not match /tmp/x2."""
    if isinstance(marker, re.Pattern):
        return marker.search(line) is not None
    start = line.find(marker)
    while start != -1:
        end = start + len(marker)
        if end == len(line) or not (line[end].isalnum() or line[end] in "-_."):
            return True
        start = line.find(marker, start + 1)
    return False


def not_ours(pids: list[int]) -> list[int]:
    """The PIDs among `pids` owned by another user (signalling them would fail, and must not be tried)."""
    me = os.getuid()
    foreign = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).uids().effective != me:
                foreign.append(pid)
    return foreign


@dataclass(frozen=True)
class Identity:
    """One process, for as long as it lives: its pid and its start time (psutil's
    `create_time`). A pid alone names whatever process the kernel hands it to next; the pair
    names only the process it was taken from, so a recycled pid is never signalled nor taken for
    a daemon that still runs."""

    pid: int
    create_time: float
    #: The PID namespace `pid` was taken in (its inode), when known: a reader in the same one
    #: looks at `pid` only; any other reader (or a pid file without it) also looks for the process
    #: under its outer pids (`process`).
    pidns: int | None = None

    @classmethod
    def of(cls, pid: int) -> Identity | None:
        """The identity of the live process `pid` (a pid of this process's PID namespace), or
        None when there is none."""
        try:
            return cls(pid, psutil.Process(pid).create_time(), _own_pidns())
        except psutil.Error:
            return None

    @classmethod
    def from_dict(cls, data: object) -> Identity | None:
        """Back from `as_dict` (None for anything else: a pid without its start time proves
        nothing)."""
        if not isinstance(data, dict):
            return None
        pid, created = data.get("pid"), data.get("create_time")
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(created, (int, float)):
            return None
        pidns = data.get("pidns")
        return cls(pid, float(created),
                   pidns if isinstance(pidns, int) and not isinstance(pidns, bool) else None)

    def as_dict(self) -> dict[str, float | int]:
        found: dict[str, float | int] = {"pid": self.pid, "create_time": self.create_time}
        if self.pidns is not None:
            found["pidns"] = self.pidns
        return found

    def process(self) -> psutil.Process | None:
        """The process, while it is this one and not a zombie; else None. A pid taken inside a
        nested PID namespace (a container, a test bed's host) is found from outside it too;
        only then is /proc scanned (supervise.ensure asks every 50 ms while a daemon starts)."""
        here = self.pidns is not None and self.pidns == _own_pidns()
        for pid in (self.pid, *(() if here else self._outer_pids())):
            try:
                proc = psutil.Process(pid)
                # psutil rounds create_time from clock ticks: equal to the hundredth is the same
                # start (and the start is the same seen from any PID namespace).
                if abs(proc.create_time() - self.create_time) > 0.01:
                    continue
                return None if proc.status() == psutil.STATUS_ZOMBIE else proc
            except psutil.Error:
                continue
        return None

    def _outer_pids(self) -> list[int]:
        """Pids here of processes whose pid in their own (nested) PID namespace is ours: Linux
        lists a process's pid in each namespace it is in, outermost first (NSpid)."""
        found = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                line = next((x for x in status.read_text().splitlines() if x.startswith("NSpid:")), "")
            except OSError:
                continue
            pids = line.split()[1:]
            if len(pids) > 1 and pids[-1] == str(self.pid):
                found.append(int(pids[0]))
        return found

    def running(self) -> bool:
        return self.process() is not None


def _own_pidns() -> int | None:
    """This process's PID namespace (the inode of /proc/self/ns/pid), None where /proc cannot say."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def terminate(pids: list[int] | list[Identity], grace: float = 3.0) -> list[int]:
    """SIGTERM, wait up to `grace` seconds, SIGKILL the rest; return PIDs still alive after that.

    Each process is identified once, by pid and start time, before any signal: a process that
    ends meanwhile and whose pid the kernel hands to another is never signalled (psutil checks the
    start time again before each signal)."""
    procs: list[psutil.Process] = []
    for item in pids:
        ident = item if isinstance(item, Identity) else Identity.of(item)
        proc = ident.process() if ident is not None else None
        if proc is not None:
            procs.append(proc)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                proc.send_signal(sig)
        with contextlib.suppress(WaitTimeout):  # the survivors are counted below
            until(functools.partial(_all_ended, procs), grace if sig == signal.SIGTERM else 2.0,
                  0.05, "the processes to end")
        procs = [p for p in procs if _lives(p)]
        if not procs:
            break
    return [p.pid for p in procs]


def _all_ended(procs: list[psutil.Process]) -> bool:
    return not any(_lives(p) for p in procs)


def _lives(proc: psutil.Process) -> bool:
    """`proc` (the very process, not a successor on its pid) still runs."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

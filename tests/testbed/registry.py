"""Run records: what each test-bed run owns, so that teardown and crash recovery remove exactly that.

Every run writes `<state root>/runs/<run id>.json` *before* it creates anything (route, namespace,
process). A run whose owner process is gone is stale: the next run removes its namespaces, its
blackhole route and its processes. Processes are identified by PID *and* start time (a PID alone may
have been reused) or by the marker variable `RAYFLEET_TESTBED_RUN=<run id>` that every process the test
bed starts carries in its environment (and passes on to its children), never by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import signal
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra.node import wait
from tests.testbed import net

DEFAULT_STATE_ROOT = Path("/tmp/rayfleet-testbed")
#: Environment variable that tags every process of a run (value: the run id).
MARKER = "RAYFLEET_TESTBED_RUN"
_RUN_ID = re.compile(r"^[0-9a-f]{6}$")


def proc_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None if it does not exist (or is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may hold spaces and parentheses: fields are counted after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def is_alive(pid: int, start: int | None) -> bool:
    return start is not None and proc_start_time(pid) == start


def kill_recorded(pids: Iterable[tuple[int, int]]) -> None:
    """SIGKILL each (pid, start time) that is still the same process."""
    for pid, start in pids:
        if is_alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def marked_pids(run_ids: set[str] | None = None) -> dict[int, str]:
    """PIDs (root namespace) of processes whose environment carries our marker → their run id.

    With `run_ids`, only those runs; without, every run.
    """
    needle = f"{MARKER}=".encode()
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(needle):
                run_id = var[len(needle) :].decode(errors="replace")
                if run_ids is None or run_id in run_ids:
                    found[int(entry.name)] = run_id
                break
    return found


def kill_marked(run_ids: set[str], timeout: float = 5.0) -> list[int]:
    """SIGKILL every process marked with one of `run_ids`, until none is left; return their PIDs."""
    killed: list[int] = []
    pids: list[int] = []

    def none_left() -> list[int] | None:
        pids[:] = [pid for pid in marked_pids(run_ids) if proc_start_time(pid) is not None]
        if not pids:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.extend(pids)
        return None

    return wait.until(none_left, timeout, 0.05, on_timeout=lambda: RuntimeError(
        f"processes of test-bed run(s) {sorted(run_ids)} survive SIGKILL: {pids}"))


@dataclass
class RunRecord:
    """One run's claim on shared machine resources; written atomically as JSON."""

    run_id: str
    # The process that owns the run; when it is gone, the run is stale.
    owner_pid: int
    owner_start: int
    # The test subnet, e.g. "10.200.3.0/24", whose blackhole route exists while the run lives; ""
    # for a run without network namespaces (the single-node Slurm).
    subnet: str
    # Where the run keeps configs and logs (kept after teardown, for post-mortems).
    workdir: str
    # Top-level processes the run started, as [pid, start time]; their children die with them.
    pids: list[list[int]] = field(default_factory=list)

    @property
    def prefix(self) -> str:
        """Prefix of every network namespace of the run."""
        return net.NETNS_PREFIX + self.run_id + "-"


class Registry:
    """The directory of run records, with a lock that serialises claims and stale cleanup."""

    def __init__(self, root: Path = DEFAULT_STATE_ROOT) -> None:
        self.root = root
        self.runs = root / "runs"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.runs.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _path(self, run_id: str) -> Path:
        return self.runs / f"{run_id}.json"

    def load_all(self) -> list[RunRecord]:
        records = []
        for path in sorted(self.runs.glob("*.json")):
            try:
                records.append(RunRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                # A record torn by a crash mid-write cannot be acted on; the orphan scans still
                # find its namespaces and processes.
                path.unlink(missing_ok=True)
        return records

    def save(self, record: RunRecord) -> None:
        tmp = self._path(record.run_id).with_suffix(".tmp")
        with open(tmp, "w") as out:
            json.dump(asdict(record), out)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self._path(record.run_id))

    def claim(self, workdir: Path, with_subnet: bool = True) -> RunRecord:
        """Clean stale runs, then reserve a fresh run id and (unless not wanted) a subnet, whose
        route is blocked before this returns, so before any namespace of the run exists.
        """
        with self.locked():
            self.clean_stale()
            live = self.load_all()
            used_ids = {r.run_id for r in live}
            used_nets = {ipaddress.ip_network(r.subnet) for r in live if r.subnet}
            used_nets |= net.routes_within(net.TEST_SUPERNET)
            free = [s for s in net.TEST_SUPERNET.subnets(new_prefix=24) if s not in used_nets]
            # Random rather than lowest-free: a run's subnet is then unlikely to be reused at once by
            # a concurrent run, which keeps "the route is gone" checks after teardown meaningful.
            subnet = secrets.choice(free) if free else None
            if with_subnet and subnet is None:
                raise RuntimeError(f"no free /24 left in {net.TEST_SUPERNET}: {len(live)} live runs")
            run_id = secrets.token_hex(3)
            while run_id in used_ids:
                run_id = secrets.token_hex(3)
            me = os.getpid()
            record = RunRecord(
                run_id=run_id,
                owner_pid=me,
                owner_start=proc_start_time(me) or 0,
                subnet=str(subnet) if with_subnet else "",
                workdir=str(workdir),
            )
            self.save(record)
            if with_subnet and subnet is not None:
                net.block_subnet(subnet)
            return record

    def add_pid(self, record: RunRecord, pid: int) -> None:
        start = proc_start_time(pid)
        if start is not None:
            record.pids.append([pid, start])
            self.save(record)

    def release(self, record: RunRecord) -> None:
        """Remove everything `record` owns: processes, namespaces, route, then the record."""
        kill_recorded((pid, start) for pid, start in record.pids)
        kill_marked({record.run_id})
        for name in net.list_netns():
            if name.startswith(record.prefix):
                net.delete_netns(name)
        if record.subnet:
            net.unblock_subnet(ipaddress.ip_network(record.subnet))
        self._path(record.run_id).unlink(missing_ok=True)

    def clean_stale(self) -> list[str]:
        """Release runs whose owner is gone, and orphans no record claims. Call with the lock held.

        Returns one line per thing removed, for the CLI to print.
        """
        done: list[str] = []
        live_ids: set[str] = set()
        live_nets: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
        for record in self.load_all():
            if is_alive(record.owner_pid, record.owner_start):
                live_ids.add(record.run_id)
                if record.subnet:
                    live_nets.add(ipaddress.ip_network(record.subnet))
            else:
                self.release(record)
                done.append(f"released stale run {record.run_id} ({record.subnet})")
        orphans = {rid for rid in marked_pids().values() if rid not in live_ids}
        if orphans:
            pids = kill_marked(orphans)
            done.append(f"killed {len(set(pids))} orphan process(es) of run(s) {sorted(orphans)}")
        for name in net.list_netns():
            run_id = net.run_id_of(name)
            if run_id is not None and _RUN_ID.match(run_id) and run_id not in live_ids:
                net.delete_netns(name)
                done.append(f"deleted orphan namespace {name}")
        for subnet in net.routes_within(net.TEST_SUPERNET, ours_only=True) - live_nets:
            net.unblock_subnet(subnet)
            done.append(f"deleted orphan route {subnet}")
        return done

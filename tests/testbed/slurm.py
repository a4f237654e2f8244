"""Real Slurm (Debian's slurmctld/slurmd 22.05 and munge) on the test bed, or on 127.0.0.1.

Nothing starts by itself and nothing outside the run's work directory is used: a per-run munge key
and socket, a per-run `slurm.conf` (found through `SLURM_CONF`), state and spool directories. Every
daemon runs inside a node (own PID namespace), so killing the node's init ends the daemons and every
job process they started.

- `SlurmCluster(n, workdir)`: its own `Testbed` of n hosts; munged and slurmctld in the client
  namespace (hostname `rft<id>-client`, the `SlurmctldHost`), one `slurmd -N <hostname>` per host.
  Slurm commands run in the client namespace (`run`, or `cli_prefix` + argv), or over SSH on any
  host (`login_host`): sshd gives sessions `SLURM_CONF`, and the munge socket is on the shared disk.
- `LocalSlurm(workdir)`: one node named after this machine at 127.0.0.1; daemons in the root network
  namespace (Slurm 22.05 cannot bind to one address: they listen on all, on random high ports, and
  only accept requests signed with the run's munge key), jobs in a PID namespace of their own with
  a private /tmp/ray. Commands run directly (`cli_prefix` = []).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from infra.node import wait
from tests.testbed import hosts
from tests.testbed.core import Testbed
from tests.testbed.hosts import Host, Node
from tests.testbed.registry import Registry, RunRecord


def render_conf(*, cluster: str, ctl_name: str, ctl_addr: str, ctl_port: int, slurmd_port: int,
                nodes: Sequence[tuple[str, str]], cpus: int, memory_mb: int, workdir: Path,
                spool: Path,
                munge_socket: Path) -> str:
    node_lines = "".join(
        f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN\n"
        for name, addr in nodes
    )
    return f"""\
# Written by tests/testbed/slurm.py for one test run.
ClusterName={cluster}
SlurmctldHost={ctl_name}({ctl_addr})
SlurmctldPort={ctl_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# The run's own munged, not the machine's (which may not exist).
AuthInfo=socket={munge_socket}
StateSaveLocation={workdir}/state
SlurmdSpoolDir={spool}/%n
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd-%n.pid
SlurmctldLogFile={workdir}/slurmctld.log
SlurmdLogFile={workdir}/slurmd-%n.log
# No cgroup hierarchy of our own to manage in a test namespace.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Heterogeneous jobs start only on a backfill pass (default every 30 s): run it every second.
SchedulerParameters=bf_interval=1
# No accounting daemon: sacct does not work here.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# Nodes declare CPUs/memory here; every "node" actually sees the whole machine.
SlurmdParameters=config_overrides
# SIGTERM → SIGKILL grace on scancel (default 30 s) kept short so tests stay fast.
KillWait=5
{node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def free_port() -> int:
    # Slurm listens on the wildcard address, so the port must be free there.
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


class _Slurm:
    """What both variants share: files, munged, the command helpers."""

    workdir: Path
    #: slurmd's spool: a short private dir (its sockets must fit in 108 bytes).
    spool: Path
    #: Argument prefix for running Slurm commands from the root namespace ([] for LocalSlurm).
    cli_prefix: list[str]
    #: Environment for Slurm commands (SLURM_CONF, PATH with `ray`, Ray safety settings, run marker).
    env: dict[str, str]
    node_names: list[str]

    def _prepare(self, workdir: Path) -> None:
        self.workdir = Path(workdir).resolve()
        for sub in ("state", "jobs"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        # slurmd's spool holds a unix socket per job step, <spool>/<node>/<node>_<job>.<step>
        # (108 bytes at most): under the work dir, job 10 on a run numbered pytest-261 was one
        # byte too long ("launch failed requeued held"). A short private dir of its own instead.
        self.spool = Path(tempfile.mkdtemp(prefix="rfsp-"))
        # A unix socket path must fit in 108 bytes.
        if len(str(self.munge_socket)) > 100:
            raise ValueError(f"work directory path too long for a unix socket: {self.workdir}")
        fd = os.open(self.workdir / "munge.key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(1024))

    @property
    def conf_path(self) -> Path:
        return self.workdir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.workdir / "munge.socket"

    @property
    def jobs_dir(self) -> Path:
        """Default working directory of commands and jobs; on the disk every node shares."""
        return self.workdir / "jobs"

    def _munged_argv(self) -> list[str]:
        w = self.workdir
        return ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                f"--key-file={w / 'munge.key'}", f"--pid-file={w / 'munged.pid'}",
                f"--seed-file={w / 'munged.seed'}", f"--log-file={w / 'munged.log'}"]

    def _wait_munge(self, deadline: float) -> None:
        wait.until(self.munge_socket.exists, max(0.0, deadline - time.monotonic()), 0.02,
                   on_timeout=lambda: TimeoutError(f"munged did not create {self.munge_socket}"))

    def run(self, cmd: str, *, check: bool = False, timeout: float = 60,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a bash command line where Slurm's commands reach slurmctld (cwd: `jobs_dir`)."""
        done = subprocess.run(
            [*self.cli_prefix, "bash", "-c", cmd], env={**self.env, **(env or {})},
            cwd=self.jobs_dir, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"slurm: {cmd!r} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def sbatch(self, script: str, *args: str) -> str:
        """Submit a batch script (its text) with extra sbatch arguments; return the job id."""
        done = subprocess.run(
            [*self.cli_prefix, "sbatch", "--parsable", *args], input=script, env=self.env,
            cwd=self.jobs_dir, capture_output=True, text=True, timeout=60, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str | None:
        """State of a job as squeue shows it (PENDING, RUNNING, COMPLETING...), None once it left."""
        done = self.run(f"squeue -h -j {job_id} -o %T", timeout=30)
        return done.stdout.strip() or None

    def wait_job(self, job_id: str, states: set[str] | None = None, timeout: float = 60) -> None:
        """Wait until the job is in one of `states`, or (states=None) has left the queue."""
        state: list[str | None] = []

        def there() -> bool:
            state[:] = [self.job_state(job_id)]
            return (state[0] is None) if states is None else (state[0] in states)

        wait.until(there, timeout, 0.2, on_timeout=lambda: TimeoutError(
            f"job {job_id} still {state[0]} after {timeout} s"))

    def wait_idle(self, timeout: float = 30) -> None:
        """Wait until every node registered and is idle."""
        states: dict[str, str] = {}

        def idle() -> bool:
            out = self.run("sinfo -h -N -o '%N %t'", timeout=30).stdout.split()
            states.clear()
            states.update(zip(out[::2], out[1::2], strict=False))
            return bool(states) and all(states.get(n) == "idle" for n in self.node_names)

        wait.until(idle, timeout, 0.1, on_timeout=lambda: TimeoutError(
            f"Slurm nodes not idle: {states}; see {self.workdir}/*.log"))


class SlurmCluster(_Slurm):
    """Multi-host Slurm on its own `Testbed` (see the module docstring)."""

    def __init__(self, n_nodes: int, workdir: Path, *, cpus: int | None = None, memory_mb: int = 2048,
                 timeout: float = 60) -> None:
        t0 = time.monotonic()
        self._prepare(Path(workdir) / "slurm")
        self.testbed = Testbed(n_nodes, Path(workdir) / "testbed", env={"SLURM_CONF": str(self.conf_path)})
        try:
            self.timings = {"testbed": round(time.monotonic() - t0, 3)}
            self._start(cpus or os.cpu_count() or 1, memory_mb, timeout)
            self.timings["up"] = round(time.monotonic() - t0, 3)
        except BaseException:
            self.testbed.close()
            raise

    @property
    def nodes(self) -> list[Host]:
        return self.testbed.hosts

    @property
    def login_host(self) -> Host:
        """A host to SSH into and run sbatch/squeue/scancel on, like a cluster's login node."""
        return self.testbed.hosts[0]

    def _start(self, cpus: int, memory_mb: int, timeout: float) -> None:
        t = time.monotonic()
        deadline = t + timeout
        tb = self.testbed
        client = tb.client
        self.node_names = [h.hostname for h in tb.hosts]
        self.conf_path.write_text(render_conf(
            cluster=f"rft{tb.run_id}", ctl_name=client.hostname, ctl_addr=client.ip,
            ctl_port=6817, slurmd_port=6818, nodes=[(h.hostname, h.ip) for h in tb.hosts],
            cpus=cpus, memory_mb=memory_mb, workdir=self.workdir, spool=self.spool,
            munge_socket=self.munge_socket,
        ))
        self.cli_prefix = tb.client_prefix
        self.env = {**client.env, "SLURM_CONF": str(self.conf_path)}
        client.popen(self._munged_argv(), log=self.workdir / "munged.out")
        self._wait_munge(deadline)
        client.popen(["slurmctld", "-D", "-f", str(self.conf_path)], log=self.workdir / "slurmctld.out",
                     env=self.env)
        for host in tb.hosts:
            host.popen(["slurmd", "-D", "-N", host.hostname, "-f", str(self.conf_path)],
                       log=self.workdir / f"slurmd-{host.name}.out", env=self.env)
        self.wait_idle(max(1.0, deadline - time.monotonic()))
        self.timings["slurm"] = round(time.monotonic() - t, 3)

    def close(self) -> None:
        """Stop everything; the daemons and jobs die with the test bed's nodes."""
        self.testbed.close()
        shutil.rmtree(self.spool, ignore_errors=True)
        self.timings["down"] = self.testbed.timings.get("down", 0.0)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class LocalSlurm(_Slurm):
    """Single-node Slurm on 127.0.0.1 in the root network namespace (see the module docstring)."""

    def __init__(self, workdir: Path, *, cpus: int | None = None, memory_mb: int = 2048,
                 timeout: float = 60) -> None:
        t0 = time.monotonic()
        self._prepare(workdir)
        self._registry = Registry()
        self._record: RunRecord | None = None
        self._node: Node | None = None
        self._closed = False
        self.timings: dict[str, float] = {}
        atexit.register(self.close)
        try:
            self._start(cpus or os.cpu_count() or 1, memory_mb, timeout)
        except BaseException:
            self.close()
            raise
        self.timings["up"] = round(time.monotonic() - t0, 3)

    def _start(self, cpus: int, memory_mb: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._record = self._registry.claim(self.workdir, with_subnet=False)
        name = socket.gethostname().split(".")[0]
        self.node_names = [name]
        self.conf_path.write_text(render_conf(
            cluster=f"rft{self._record.run_id}", ctl_name="localhost", ctl_addr="127.0.0.1",
            ctl_port=free_port(), slurmd_port=free_port(), nodes=[(name, "127.0.0.1")], cpus=cpus,
            memory_mb=memory_mb, workdir=self.workdir, spool=self.spool,
            munge_socket=self.munge_socket,
        ))
        self.cli_prefix = []
        self.env = hosts.node_env(self._record.run_id, {"SLURM_CONF": str(self.conf_path)})
        # One node holds munged, slurmctld and slurmd: its own PID namespace, so that stopping it ends
        # every job process too, but the machine's network, hostname and files, except a private
        # /tmp/ray, so a job's Ray cannot repoint the machine's /tmp/ray/session_latest.
        node = Node(name="slurm", hostname=socket.gethostname(), ip="127.0.0.1", netns=None, env=self.env,
                    log_path=self.workdir / "node.log")
        self._node = node
        pid = node.start([hosts.tmpfs_over("/tmp/ray")], [self._munged_argv()])
        self._registry.add_pid(self._record, pid)
        node.wait_started(deadline)
        self._wait_munge(deadline)
        node.popen(["slurmctld", "-D", "-f", str(self.conf_path)], log=self.workdir / "slurmctld.out")
        node.popen(["slurmd", "-D", "-N", name, "-f", str(self.conf_path)], log=self.workdir / "slurmd.out")
        self.wait_idle(max(1.0, deadline - time.monotonic()))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        shutil.rmtree(self.spool, ignore_errors=True)
        t0 = time.monotonic()
        if self._node is not None:
            self._node.stop()
        if self._record is not None:
            with self._registry.locked():
                self._registry.release(self._record)
        self.timings["down"] = round(time.monotonic() - t0, 3)

    def __enter__(self) -> LocalSlurm:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

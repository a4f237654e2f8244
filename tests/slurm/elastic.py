"""The autoscaling cluster of tests/slurm/test_e2e_autoscale.py on the 2-host Slurm test bed: what
its tests read of it (the queue, Ray's nodes, its Prometheus, `top`) and its 0 -> 2 -> 0 round.

Its head's job holds every CPU of its host (the bed's nodes declare the machine's CPUs), so Ray's
autoscaler puts its workers (type `cpu`, 1 CPU, 0..2) on the other host: both fit there, and a job
of another user taking all but one of that host's CPUs leaves room for one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from infra.node import rayproc
from infra.providers.slurm.script import HEAD_TYPE
from tests.conftest import ROOT, run_invoke
from tests.slurm.conftest import LoginCluster, ok, temp_marker
from tests.testbed.hosts import Host, ray_bin_dir
from tests.waiting import wait_until

NAME = "elastic"
#: Workers live seconds here: Prometheus scrapes every 2 s so that the history sees them.
SPEC = """cpus_per_node: {cpus}
idle_timeout_minutes: 0.2
tracking: mlflow
metrics: prometheus
metrics_history: {{days: 2, size_mb: 256, scrape_interval_s: 2}}
worker_types:
  cpu: {{cpus_per_node: 1, max_workers: 2}}
environment:
  env_vars: {{AUTOSCALER_UPDATE_INTERVAL_S: '1'}}
"""

#: Each Ray job's id, state and message from the head's job API (argv: token file, URL).
JOB_MESSAGES = """\
import json, sys, urllib.request
token = open(sys.argv[1]).read().strip()
request = urllib.request.Request(sys.argv[2], headers={"Authorization": f"Bearer {token}"})
for job in json.load(urllib.request.urlopen(request, timeout=10)):
    print(job.get("submission_id"), job.get("status"), (job.get("message") or "")[-600:])
"""

#: The number of ALIVE nodes in Ray's state API on the head's loopback (argv: token file, URL):
#: a poll costs a python3 on the head, not an `invoke status` (1-2 CPU-s each).
ALIVE = """\
import json, sys, urllib.request
token = open(sys.argv[1]).read().strip()
request = urllib.request.Request(sys.argv[2], headers={"Authorization": f"Bearer {token}"})
rows = json.load(urllib.request.urlopen(request, timeout=10))["data"]["result"]["result"]
print(sum(1 for row in rows if row.get("state") == "ALIVE"))
"""


#: The round's job: N one-CPU tasks on N nodes (STRICT_SPREAD), each logging an MLflow run (its
#: host as a param) and then holding its CPU until the file RELEASE exists (the test creates it
#: on the shared work dir once it saw the nodes busy), at most MOST seconds. Nothing about MLflow
#: in the code: the nodes' environment names the head's server and holds the login.
TRACKED_ROUND = """\
import os
import socket
import sys
import time

import mlflow
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote(num_cpus=1)
def log_and_hold(release, most):
    with mlflow.start_run() as run:
        mlflow.log_param("host", socket.gethostname())
        mlflow.log_metric("on_node", 1.0)
    deadline = time.monotonic() + most
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.2)
    return run.info.run_id


count, release, most = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
ray.init()
group = placement_group([{"CPU": 1}] * count, strategy="STRICT_SPREAD")
ray.get(group.ready())
print("RUNS", ray.get([log_and_hold.options(
    scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote(release, most)
    for i in range(count)]))
"""


@dataclass(frozen=True)
class Round:
    """What one 0 -> 2 -> 0 round of the autoscaler showed, each figure taken as it happened."""

    #: Prometheus's node targets once the two workers were scraped.
    nodes: list[dict[str, Any]]
    #: `top`'s frame once it showed the job's bundles reserved, and Ray's alive nodes then.
    frame: dict[str, Any]
    alive: int
    #: `top`'s frame once the workers' targets had gone, and Ray's alive nodes then.
    after: dict[str, Any]
    after_alive: int
    #: The environment slurmctld kept of each worker job while it ran, by job id.
    environments: dict[str, str]


@dataclass
class Elastic(LoginCluster):
    #: CPUs of each bed node: the head's job takes them all.
    cpus: int = 0
    #: This cluster's 0 -> 2 -> 0 round (the `scaled` fixture); None until it ran.
    scaled: Round | None = None
    #: The status each Ray job run on this cluster since its `up` ends with (the kept history's).
    ran: list[str] = field(default_factory=list)

    def jobs(self) -> list[dict[str, str]]:
        """Every job in the queue carrying the cluster id (what ownership is decided by)."""
        out = self.slurm.run("squeue -h -o '%i|%T|%j|%k'", check=True).stdout
        rows = [dict(zip(("id", "state", "name", "comment"), line.split("|", 3), strict=True))
                for line in out.splitlines() if line.strip()]
        return [r for r in rows if f"rayfleet-cluster={self.job['cluster_id']}" in r["comment"]]

    def workers(self) -> list[dict[str, str]]:
        return [r for r in self.jobs() if "role=worker" in r["comment"]]

    def head_host(self) -> Host:
        return next(h for h in self.slurm.nodes if h.hostname == self.job["head_node"])

    def other_host(self) -> Host:
        """The test-bed host that is not the head's."""
        return next(h for h in self.slurm.nodes if h.hostname != self.job["head_node"])

    def _on_head(self, script: str, path: str) -> str:
        """A python3 `script` on the head's node given the token file and the loopback dashboard's
        `path` (the token is read from its file inside Python: never on a command line)."""
        token = self.slurm.jobs_dir / "keys" / self.job["cluster_id"] / "ray-token"
        url = f"http://127.0.0.1:{self.job['dashboard_port']}{path}"
        return self.head_host().run(f"python3 - {shlex.quote(str(token))} {url} <<'EOF'\n"
                                    f"{script}EOF\n", timeout=60).stdout

    def ray_alive(self) -> int | None:
        """Ray's alive nodes, read on the head (None while it does not answer): for polls."""
        out = self._on_head(ALIVE, "/api/v0/nodes?limit=100").strip()
        return int(out) if out.isdigit() else None

    def post_mortem(self) -> str:
        """For a wait that timed out: the queue, the Ray jobs' states, and the tail of the head's
        autoscaler logs (Ray's monitor in the head job's private temp dir)."""
        queue_now = self.slurm.run("squeue -h -o '%i %T %r %j %k'").stdout
        status = self.invoke("status", "--json")
        session = f"{temp_marker(self.job)}*/ray/session_latest/logs"
        logs = self.head_host().run(f"tail -n 8 {session}/monitor.* 2>&1 | cut -c1-300; true",
                                    timeout=60).stdout
        # A failed Ray job's reason (a driver's error, or its runtime env's) is in the job API's
        # `message`, on the head's loopback dashboard, and in the runtime env's logs.
        jobs = self._on_head(JOB_MESSAGES, "/api/jobs/") + self.head_host().run(
            f"tail -n 15 {session}/runtime_env_setup-*.log {session}/job-driver-*.log "
            "2>&1 | cut -c1-300; true", timeout=60).stdout
        return (f"the queue now:\n{queue_now}\n`status --json` (exit {status.returncode}): "
                f"{status.stdout[-1200:]}\nthe Ray jobs' messages and logs:\n{jobs}\n"
                f"the head's monitor logs:\n{logs}")

    def wait(self, check: Any, what: str, timeout: float = 180) -> Any:
        """wait_until, with the post mortem in the message of a timeout."""
        try:
            return wait_until(check, what, timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.post_mortem()}") from None

    @contextlib.contextmanager
    def crowded(self) -> Iterator[None]:
        """Another user's job on the other host, holding all of its CPUs but one."""
        blocker = self.slurm.sbatch("#!/bin/bash\nsleep 600\n",
                                    f"--nodelist={self.other_host().hostname}",
                                    f"--cpus-per-task={self.cpus - 1}", "--output=/dev/null")
        try:
            self.slurm.wait_job(blocker, {"RUNNING"})
            yield
        finally:
            self.slurm.run(f"scancel {blocker}")
            self.slurm.wait_job(blocker, timeout=60)

    @property
    def block(self) -> rayproc.PortBlock:
        return rayproc.PortBlock(int(self.job["port_base"]))

    def prometheus(self, path: str) -> Any:
        """Prometheus's own HTTP API, asked on the head's node, on its loopback where it
        listens: the parsed answer, or None while it does not answer."""
        url = f"http://127.0.0.1:{self.block.prometheus}{path}"
        done = self.head_host().run(f"curl -sf --max-time 5 '{url}'", timeout=30)
        return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None

    def top(self) -> dict[str, Any]:
        return dict(json.loads(ok(self.invoke("top", "--once", "--json", timeout=120))))

    def prometheus_processes(self) -> list[str]:
        """`pid args` of the head node's Prometheus of this cluster (its config names the
        head's private dir)."""
        temp = str(self.job["temp_dir"])
        out = self.head_host().run("ps -eo pid=,args=", check=True).stdout
        return [line.strip() for line in out.splitlines()
                if "prometheus --config.file=" in line and temp in line]


def node_targets(cluster: Elastic) -> list[dict[str, Any]] | None:
    """Prometheus's active targets once all are up, without the head's autoscaler and dashboard
    (their own metrics ports of the block): one per Ray node."""
    found = cluster.prometheus("/api/v1/targets?state=active")
    if not found:
        return None
    targets = found["data"]["activeTargets"]
    if not targets or any(t["health"] != "up" for t in targets):
        return None
    own = {f"{cluster.job['head_ip']}:{p}" for p in (cluster.block.autoscaler_metrics,
                                                    cluster.block.dashboard_metrics)}
    instances = {t["labels"]["instance"] for t in targets}
    return [t for t in targets if t["labels"]["instance"] not in own] if own <= instances else None


def scale_0_2_0(cluster: Elastic) -> Round:
    """Three nodes wanted (one CPU each, STRICT_SPREAD, each logging an MLflow run, held until
    `top` showed them busy), the head alone: two workers from zero, which the autoscaler cancels
    once done and idle."""
    folder = cluster.home.parent / "round"
    folder.mkdir(exist_ok=True)
    (folder / "tracked_round.py").write_text(TRACKED_ROUND)
    # Released once seen (a fixed hold would have to cover the slowest `top` under CI's load).
    release = cluster.slurm.jobs_dir / f"release-{cluster.job['cluster_id']}"
    ok(run_invoke("-r", str(ROOT), "submit", "--cluster", str(cluster.spec), "--no-wait",
                  "tracked_round.py", "--", "3", str(release), "180", cwd=folder,
                  env={"PATH": f"{ray_bin_dir()}:{os.environ.get('PATH', '')}",
                       "RAYFLEET_HOME": str(cluster.home)}))
    cluster.ran.append("SUCCEEDED")
    started = time.monotonic()

    def three() -> list[dict[str, Any]] | None:
        found = node_targets(cluster)
        return found if found is not None and len(found) == 3 else None

    nodes = cluster.wait(three, "3 Ray nodes' targets up in Prometheus", timeout=240)
    print(f"\n[elastic] 2 workers scraped {time.monotonic() - started:.1f}s after the demand")
    # slurmctld keeps each batch job's environment while the job is known (StateSaveLocation).
    environments = {worker["id"]: kept.read_text(errors="replace")
                    for worker in cluster.workers()
                    for kept in (cluster.slurm.workdir / "state").glob(
                        f"hash.*/job.{worker['id']}/environment")}

    def reserved() -> dict[str, Any] | None:
        """A frame once it shows the job's bundles reserved: a raylet reports its resources
        every few seconds, behind its node's joining."""
        frame = cluster.top()
        got = {t["type"]: t["cpu_reserved"] for t in frame["nodes"]}
        return frame if got == {HEAD_TYPE: 1, "cpu": 2} else None

    frame = wait_until(reserved, "top to show 1 CPU reserved on the head, 2 on the workers",
                       timeout=120, interval=1)
    alive = cluster.alive_nodes()
    release.touch()
    print(f"[elastic] top showed the bundles {time.monotonic() - started:.1f}s after the demand")
    # Prometheus follows Ray's file as the workers go.
    wait_until(lambda: (found := node_targets(cluster)) is not None and len(found) == 1,
               "the workers' targets gone from Prometheus", timeout=240, interval=1)
    print(f"[elastic] workers' targets gone {time.monotonic() - started:.1f}s after the demand")
    after = cluster.top()
    release.unlink()
    return Round(nodes=nodes, frame=frame, alive=alive, after=after,
                 after_alive=cluster.alive_nodes(), environments=environments)

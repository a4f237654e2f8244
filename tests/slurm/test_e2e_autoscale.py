"""An autoscaling Ray cluster on the 2-host Slurm test bed, through its login host (issue 14), who
can reach its Ray (issue 11), and its MLflow server seen from an autoscaled worker (issue 24). One
cluster serves every scenario; each can run alone (the `elastic` fixture hands it the cluster up
with its head alone, and brings it up again after the teardown scenario):

head job (exclusive: all of one host) + worker type `cpu` (exclusive, 0..2): one worker fits on
the other host, a second one stays PENDING (the partition is full). Ray's own autoscaler (v2, on
the head) submits and cancels the worker jobs through our node provider; nothing is patched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import slurm_autoscale
from infra.node.slurm import queue
from tests.slurm.conftest import (
    LoginCluster,
    login_spec,
    ok,
    submit_script,
    temp_marker,
)
from tests.testbed.hosts import Host, ray_bin_dir
from tests.testbed.slurm import SlurmCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

SPEC = """exclusive: true
idle_timeout_minutes: 0.2
tracking: mlflow
worker_types:
  cpu: {cpus_per_node: 1, max_workers: 2}
environment:
  env_vars: {AUTOSCALER_UPDATE_INTERVAL_S: '1'}
"""


#: Each Ray job's id, state and message from the head's job API (argv: token file, URL).
JOB_MESSAGES = """\
import json, sys, urllib.request
token = open(sys.argv[1]).read().strip()
request = urllib.request.Request(sys.argv[2], headers={"Authorization": f"Bearer {token}"})
for job in json.load(urllib.request.urlopen(request, timeout=10)):
    print(job.get("submission_id"), job.get("status"), (job.get("message") or "")[-600:])
"""


class Elastic(LoginCluster):
    def jobs(self) -> list[dict[str, str]]:
        """Every job in the queue carrying the cluster id (what ownership is decided by)."""
        out = self.slurm.run("squeue -h -o '%i|%T|%j|%k'", check=True).stdout
        rows = [dict(zip(("id", "state", "name", "comment"), line.split("|", 3), strict=True))
                for line in out.splitlines() if line.strip()]
        return [r for r in rows if f"rayfleet-cluster={self.job['cluster_id']}" in r["comment"]]

    def workers(self) -> list[dict[str, str]]:
        return [r for r in self.jobs() if "role=worker" in r["comment"]]

    def post_mortem(self) -> str:
        """For a wait that timed out: the queue, the Ray jobs' states, and the tail of the head's
        autoscaler logs (Ray's monitor in the head job's private temp dir)."""
        queue_now = self.slurm.run("squeue -h -o '%i %T %r %j %k'").stdout
        status = self.invoke("status", "--json")
        head = next(h for h in self.slurm.nodes if h.hostname == self.job["head_node"])
        session = f"{temp_marker(self.job)}*/ray/session_latest/logs"
        logs = head.run(f"tail -n 8 {session}/monitor.* 2>&1 | cut -c1-300; true",
                        timeout=60).stdout
        # A failed Ray job's reason (a driver's error, or its runtime env's) is in the job API's
        # `message`, on the head's loopback dashboard, and in the runtime env's logs.
        # The token is read from its file inside Python: never on a command line.
        token = self.slurm.jobs_dir / "keys" / self.job["cluster_id"] / "ray-token"
        url = f"http://127.0.0.1:{self.job['dashboard_port']}/api/jobs/"
        jobs = head.run(f"python3 - {shlex.quote(str(token))} {url} <<'EOF'\n{JOB_MESSAGES}EOF\n"
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

    def other_host(self) -> Host:
        """The test-bed host that is not the head's."""
        return next(h for h in self.slurm.nodes if h.hostname != self.job["head_node"])


@pytest.fixture(scope="module")
def module_cluster(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Elastic]:
    work = tmp_path_factory.mktemp("elastic")
    cluster = Elastic(login_spec(work, slurm_cluster, "elastic", SPEC), work / "home",
                      slurm_cluster)
    try:
        yield cluster
    finally:
        if (cluster.home / "state" / "elastic.json").exists():
            cluster.invoke("teardown")


@pytest.fixture
def elastic(module_cluster: Elastic) -> Elastic:
    """The module's cluster, up (again, after the teardown scenario) with its head alone."""
    if not (module_cluster.home / "state" / "elastic.json").exists():
        started = time.monotonic()
        ok(module_cluster.invoke("up"))
        print(f"\n[elastic] up in {time.monotonic() - started:.1f}s")
    wait_until(lambda: module_cluster.workers() == [] or None, "the head alone (no worker job)")
    return module_cluster


PROBE = """
import json, os, socket, sys
head, gcs, client, agent, dashboard = sys.argv[1], *map(int, sys.argv[2:6])
result = {}
for name, port in (("gcs", gcs), ("client", client), ("agent", agent), ("dashboard", dashboard)):
    try:
        socket.create_connection((head, port), timeout=3).close()
        result[name] = "open"
    except OSError as exc:
        result[name] = type(exc).__name__
import requests
token = os.environ.get("PROBE_TOKEN_FILE")
headers = {"Authorization": "Bearer " + open(token).read().strip()} if token else {}
answer = requests.get(f"http://{head}:{agent}/api/job_agent/jobs/nosuchjob/logs",
                      headers=headers, timeout=10)
result["job_api"] = answer.status_code
from ray._raylet import GcsClient
try:
    nodes = GcsClient(address=f"{head}:{gcs}").get_all_node_info(timeout=10)
    result["gcs_nodes"] = len(nodes)
except Exception as exc:
    result["gcs_nodes"] = str(exc).splitlines()[0][:200]
print("PROBE " + json.dumps(result))
"""


def probe(host: Host, job: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    base = int(job["port_base"])
    args = [job["head_ip"], job["gcs_port"], job["client_port"], base + 5, job["dashboard_port"]]
    done = host.run(f"python3 - {' '.join(str(a) for a in args)} <<'EOF'\n{PROBE}\nEOF",
                    env={"RAY_USAGE_STATS_ENABLED": "0", **env}, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, f"{done.stdout}\n{done.stderr}"
    return dict(json.loads(lines[-1].removeprefix("PROBE ")))


def test_another_host_reaches_the_ports_but_not_ray_without_the_token(elastic: Elastic) -> None:
    job = elastic.job
    other = elastic.other_host()
    token = elastic.slurm.jobs_dir / "keys" / job["cluster_id"] / "ray-token"
    assert oct(token.stat().st_mode & 0o777) == "0o600"
    without = probe(other, job, {"RAY_AUTH_MODE": "disabled"})
    # TCP reaches Ray's ports (the GCS must be reachable for workers), the dashboard is loopback.
    assert without["gcs"] == without["client"] == without["agent"] == "open", without
    assert without["dashboard"] == "ConnectionRefusedError", without
    # ...but neither the job API nor the GCS (Ray's own client) answers without the token.
    assert without["job_api"] == 401, without
    assert not isinstance(without["gcs_nodes"], int), without
    with_token = probe(other, job, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                                    "PROBE_TOKEN_FILE": str(token)})
    assert with_token["job_api"] != 401 and with_token["gcs_nodes"] == 1, with_token


def test_scale_from_zero_runs_the_job_on_both_hosts_then_the_idle_worker_goes(
        elastic: Elastic) -> None:
    assert elastic.workers() == [] and elastic.alive_nodes() == 1
    started = time.monotonic()
    # The job, timed by bench/slurm_autoscale.py's own arm (CI measures that bench here).
    env = {**os.environ, "PATH": f"{ray_bin_dir()}:{os.environ['PATH']}",
           "RAYFLEET_HOME": str(elastic.home)}
    placed, result = slurm_autoscale.run_ours(env, elastic.spec)
    print(f"\n[elastic] 2-node job from zero workers: {time.monotonic() - started:.1f}s; "
          f"bench/slurm_autoscale.py: demand -> worker joined {placed:.1f}s")
    assert 0 < placed < time.monotonic() - started, placed
    assert result["hosts"] == sorted(h.hostname for h in elastic.slurm.nodes)
    workers = elastic.workers()
    assert len(workers) == 1 and workers[0]["state"] == "RUNNING", workers
    assert workers[0]["name"].startswith(f"rf-elastic-{elastic.job['cluster_id']}-w-cpu-")
    # The worker's walltime ends before the head's (spec: 1:00:00 for both).
    limits = dict(line.split() for line in elastic.slurm.run(
        "squeue -h -o '%i %L'", check=True).stdout.splitlines())
    head_left = queue.time_limit_seconds(limits[str(elastic.job["job_id"])])
    assert queue.time_limit_seconds(limits[workers[0]["id"]]) < head_left
    # Idle, the worker's job is cancelled; the head stays.
    started = time.monotonic()
    wait_until(lambda: elastic.workers() == [] or None, "the idle worker's job to be cancelled")
    print(f"\n[elastic] idle worker gone after {time.monotonic() - started:.1f}s")
    assert [j["state"] for j in elastic.jobs()] == ["RUNNING"]
    assert elastic.alive_nodes() == 1
    # bench/slurm_autoscale.py's other arm on the freed host: a plain `ray start` in a bare sbatch
    # job, cancelled once started; the head is alone again after it.
    job = elastic.job
    token = elastic.slurm.jobs_dir / "keys" / job["cluster_id"] / "ray-token"
    bare = slurm_autoscale.run_bare(elastic.slurm, f"{job['head_ip']}:{job['gcs_port']}", token)
    print(f"[elastic] bench/slurm_autoscale.py: bare sbatch -> running + ray start {bare:.1f}s")
    assert bare > 0
    wait_until(lambda: elastic.alive_nodes() == 1 or None, "the bare node to leave Ray")


#: One run from each of two nodes (the head and an autoscaled worker), with nothing about MLflow in
#: the code: the nodes' environment names the head's server and holds the login.
TRACKED_SPREAD = """\
import json
import socket

import mlflow
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote(num_cpus=1)
def log_metric():
    with mlflow.start_run() as run:
        mlflow.log_metric("on_node", 1.0)
    return {"host": socket.gethostname(), "run_id": run.info.run_id}


ray.init()
group = placement_group([{"CPU": 1}] * 2, strategy="STRICT_SPREAD")
ray.get(group.ready())
runs = ray.get([log_metric.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, i))
                .remote() for i in range(2)])
print("TRACKED " + json.dumps(runs))
"""


def test_an_autoscaled_worker_logs_to_the_heads_tracking_server(elastic: Elastic,
                                                                 tmp_path: Path) -> None:
    done = ok(submit_script(tmp_path, elastic.spec, "tracked.py", TRACKED_SPREAD,
                            env={"RAYFLEET_HOME": str(elastic.home)}))
    runs = json.loads([line for line in done.splitlines() if line.startswith("TRACKED ")][-1]
                      .removeprefix("TRACKED "))
    assert sorted(r["host"] for r in runs) == sorted(h.hostname for h in elastic.slurm.nodes)
    [worker] = [w["id"] for w in elastic.workers()]
    # Both runs are in the server's store on the shared work dir.
    store = elastic.slurm.jobs_dir / "tracking" / "elastic" / "mlflow.db"
    with contextlib.closing(sqlite3.connect(store)) as db:
        logged = {row[0] for row in db.execute(
            "SELECT run_uuid FROM metrics WHERE key = 'on_node' AND value = 1.0")}
    assert logged == {r["run_id"] for r in runs}
    # The worker read the password from its file: it did not come with the autoscaler's sbatch
    # environment, which slurmctld keeps (the cluster id did, which shows the check looks).
    password = (elastic.home / "keys" / "elastic" / "mlflow-password").read_text().strip()
    [kept] = list((elastic.slurm.workdir / "state").glob(f"hash.*/job.{worker}/environment"))
    environment = kept.read_text(errors="replace")
    assert f"RF_CLUSTER_ID={elastic.job['cluster_id']}" in environment
    assert password not in environment
    wait_until(lambda: elastic.workers() == [] or None, "the idle worker's job to be cancelled")


def test_a_pending_worker_is_shown_and_cancelled_when_nobody_needs_it(elastic: Elastic) -> None:
    # Three nodes wanted, room for one worker: the second worker job waits (partition full).
    job_id = ok(elastic.invoke("submit", "--no-wait", "tests/data/spread_job.py", "--", "3"))
    job_id = job_id.strip().splitlines()[-1]
    # What the queue went through, for a failure's message: a CI run at load ~8 timed out here
    # once, not reproduced on a quiet machine (2 of 2 there).
    seen: list[list[str]] = []

    def one_running_one_pending() -> bool | None:
        states = sorted(w["state"] for w in elastic.workers())
        if not seen or seen[-1] != states:
            seen.append(states)
        return states == ["PENDING", "RUNNING"] or None

    try:
        elastic.wait(one_running_one_pending, "one running and one pending worker job")
    except AssertionError as exc:
        raise AssertionError(f"the worker jobs' states, in order: {seen}; {exc}") from None
    rows = elastic.status()["provider_resources"]
    pending = [r for r in rows if r["state"] == "PENDING"]
    assert len(pending) == 1 and pending[0]["role"] == "worker (cpu)", rows
    assert pending[0]["queue position"].endswith("of 1"), rows
    ok(elastic.invoke("stop-job", job_id))
    started = time.monotonic()
    wait_until(lambda: elastic.workers() == [] or None, "both worker jobs to be cancelled")
    print(f"\n[elastic] pending and idle workers cancelled {time.monotonic() - started:.1f}s "
          "after the demand went")


def test_a_worker_cancelled_outside_is_replaced_and_teardown_leaves_nothing(
        elastic: Elastic) -> None:
    job_id = ok(elastic.invoke("submit", "--no-wait", "tests/data/spread_job.py", "--", "2",
                               "600")).strip().splitlines()[-1]
    first = elastic.wait(lambda: [w for w in elastic.workers() if w["state"] == "RUNNING"] or None,
                         "a running worker")[0]
    wait_until(lambda: elastic.alive_nodes() == 2 or None, "the worker to join")
    elastic.slurm.run(f"scancel {first['id']}", check=True)
    started = time.monotonic()
    second = wait_until(lambda: [w for w in elastic.workers() if w["id"] != first["id"]
                                 and w["state"] == "RUNNING"] or None, "a replacement worker")[0]
    wait_until(lambda: elastic.alive_nodes() == 2 or None, "the replacement to join")
    print(f"\n[elastic] worker {first['id']} cancelled outside, {second['id']} joined "
          f"{time.monotonic() - started:.1f}s later (Ray job {job_id} still needs it)")

    job = elastic.job
    ok(elastic.invoke("teardown"))
    assert elastic.slurm.run("squeue -h -o '%k'", check=True).stdout.count(
        f"rayfleet-cluster={job['cluster_id']}") == 0
    for host in elastic.slurm.nodes:
        marker = temp_marker(job).replace(".", "[.]")
        assert host.run(f"pgrep -af '{marker}' || true").stdout.strip() == "", host.name
    assert not (elastic.home / "state" / "elastic.json").exists()
    assert not (elastic.slurm.jobs_dir / "keys" / job["cluster_id"]).exists()

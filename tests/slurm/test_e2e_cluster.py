"""The Slurm provider on the 2-host test bed, as an HPC user runs it: Slurm commands over SSH on the
login host, compute nodes reachable only through it, the dashboard and the MLflow tracking server
through SSH tunnels; on shared nodes and a shaky controller (issue 10), with pinned host keys for
the compute nodes (issue 11). Each cluster here serves several of these concerns at once (one
`up` of a Ray cluster costs the 2-core CI machine tens of CPU-seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from bench import slurm_up
from infra.core import auth
from tests.conftest import ROOT, held_url, run_invoke
from tests.slurm.conftest import (
    Register,
    invoke,
    job_of,
    login_spec,
    ok,
    one_line_error,
    ray_left_on_hosts,
    submit_script,
)
from tests.testbed.hosts import Host, ray_bin_dir
from tests.testbed.slurm import SlurmCluster
from tests.waiting import read_json, wait_until

pytestmark = pytest.mark.slow

#: A user's job with nothing about MLflow configured: a Ray task pinned to a node other than the
#: driver's (the head's) starts a run and logs a metric there; a one-CPU task pinned to each alive
#: node says its host (both nodes take work: the job a test of its own ran for that once).
TRACKED_JOB = """\
import json
import socket

import mlflow
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init()
here = ray.get_runtime_context().get_node_id()
alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
other = [n for n in alive if n != here][0]


@ray.remote(num_cpus=1)
def log_metric():
    with mlflow.start_run() as run:
        mlflow.log_metric("from_worker", 42.0)
    return {"run_id": run.info.run_id, "host": socket.gethostname()}


@ray.remote(num_cpus=1)
def host():
    return socket.gethostname()


def pinned(node):
    return NodeAffinitySchedulingStrategy(node, soft=False)


hosts = [host.options(scheduling_strategy=pinned(node)).remote() for node in alive]
tracked = ray.get(log_metric.options(scheduling_strategy=pinned(other)).remote())
print("TRACKED " + json.dumps({**tracked, "hosts": sorted(ray.get(hosts))}))
"""


def _submit_tracked_job(tmp_path: Path, spec: Path) -> dict[str, Any]:
    done = submit_script(tmp_path / "tracked", spec, "tracked.py", TRACKED_JOB)
    lines = [line for line in ok(done).splitlines() if line.startswith("TRACKED ")]
    assert lines, done.stdout
    return dict(json.loads(lines[-1].removeprefix("TRACKED ")))


def _check_tracking(tmp_path: Path, rf_home: Path, spec: Path,
                    job: dict[str, Any]) -> dict[str, Any]:
    """Metrics logged on the worker's host land in the head's server, which wants the login."""
    tracked = _submit_tracked_job(tmp_path, spec)
    [worker] = [n["hostname"] for n in job["nodes"] if not n.get("head")]
    assert tracked["host"] == worker, f"the task ran on {tracked['host']}, not on {worker}"
    password = (rf_home / "keys" / spec.stem / "mlflow-password").read_text().strip()
    with held_url("mlflow", "--cluster", str(spec),
                  env={"PATH": f"{ray_bin_dir()}:/usr/bin:/bin"}) as url:
        run = f"{url}/api/2.0/mlflow/runs/get"
        assert requests.get(run, params={"run_id": tracked["run_id"]},
                            timeout=10).status_code == 401
        got = requests.get(run, params={"run_id": tracked["run_id"]},
                           auth=("rayfleet", password), timeout=10)
        assert got.status_code == 200, got.text
        metrics = {m["key"]: m["value"] for m in got.json()["run"]["data"]["metrics"]}
        assert metrics == {"from_worker": 42.0}
    shown = ok(invoke("status", "--cluster", str(spec)))
    assert re.search(r"tracking: http://127\.0\.0\.1:\d+ \(1 runs", shown), shown
    return tracked


#: A Serve application that says where it runs and whether its replica finds the tracking server.
SERVED_APP = """\
import os
import socket

from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Where:
    def __call__(self, request):
        return {"host": socket.gethostname(), "tracking": os.environ.get("MLFLOW_TRACKING_URI")}


app = Where.bind()
"""


def _check_serve(tmp_path: Path, spec: Path) -> None:
    """Serve's HTTP endpoint on the head, reached through a tunnel (`invoke serve-url`)."""
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "where.py").write_text(SERVED_APP)
    done = run_invoke("-r", str(ROOT), "serve-deploy", "--cluster", str(spec), "where:app",
                      cwd=folder, env={"PATH": f"{ray_bin_dir()}:{os.environ.get('PATH', '')}"},
                      timeout=600)
    ok(done)
    # The URL outlives the command (`"$(invoke serve-url)"` in a script): the cluster's detached
    # tunnel, the same one on a second call; teardown ends it.
    env = {"PATH": f"{ray_bin_dir()}:{os.environ.get('PATH', '')}"}
    urls = [ok(run_invoke("serve-url", "--cluster", str(spec), "--name", "where", env=env,
                          timeout=120)).strip().splitlines()[-1] for _ in range(2)]
    assert urls[0] == urls[1] and urls[0].startswith("http://127.0.0.1:"), urls
    answer = requests.get(urls[0], timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["tracking"].startswith("http://"), answer.json()


def _check_no_secret_shown(rf_home: Path, spec: Path, slurm_cluster: SlurmCluster) -> None:
    """The MLflow password is on no command line of any host and in no file but its own."""
    keys = rf_home / "keys" / spec.stem
    # Every host's command lines, listed once for the three secrets.
    listed = {host.name: host.run("ps -eww -o args", check=True).stdout
              for host in [slurm_cluster.login_host, *slurm_cluster.nodes]}
    here = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True,
                          check=True).stdout
    for secret in ("mlflow-password", "mlflow-flask-secret", "ray-token"):
        value = (keys / secret).read_text().strip()
        for name, lines in listed.items():
            assert value not in lines, f"{secret} on a command line of {name}"
        assert value not in here
        # slurmctld keeps every batch job's environment (StateSaveLocation): not a secret in it.
        for folder in (rf_home, slurm_cluster.jobs_dir, slurm_cluster.workdir / "state"):
            for path in folder.rglob("*"):
                if path.is_file() and "keys" not in path.relative_to(folder).parts:
                    assert value not in path.read_text(errors="replace"), f"{secret} in {path}"


def _job_environments(slurm_cluster: SlurmCluster, job_id: str) -> str:
    """The environment slurmctld keeps for a batch job (proof that the check above looks)."""
    found = list((slurm_cluster.workdir / "state").glob(f"hash.*/job.{job_id}/environment"))
    assert found, f"slurmctld keeps no environment of job {job_id} here"
    return found[0].read_text(errors="replace")


def _check_store_kept(slurm_cluster: SlurmCluster, spec: Path, tracked: dict[str, Any],
                      said: str) -> None:
    """Teardown kept the store on the shared work dir, said where, and the run is in it."""
    store = slurm_cluster.jobs_dir / "tracking" / spec.stem
    assert f"tracking data kept in {slurm_cluster.login_host.ssh_user}@" \
           f"{slurm_cluster.login_host.ip}:{store}" in " ".join(said.split()), said
    with contextlib.closing(sqlite3.connect(store / "mlflow.db")) as db:
        rows = db.execute("SELECT value FROM metrics WHERE run_uuid = ? AND key = 'from_worker'",
                          (tracked["run_id"],)).fetchall()
    assert rows == [(42.0,)]


def next_job_id(slurm: SlurmCluster) -> int:
    """The id Slurm gives the next job (this module submits one job at a time)."""
    probe = slurm.sbatch("#!/bin/bash\ntrue\n", "--output=/dev/null")
    slurm.wait_job(probe, timeout=60)
    return int(probe) + 1


@dataclass
class Squat:
    """Another user's things where the next job will run: a process holding the node-manager
    port of the job's block on the second host, and directories where the old scheme put the
    job's temp dirs (/tmp is shared by the test bed's hosts), with a "helper" in them."""

    expected: int
    base: int
    worker: Host
    planted: list[Path]


@contextlib.contextmanager
def _squatted(tmp_path: Path, slurm: SlurmCluster, later: int = 0) -> Iterator[Squat]:
    """`later`: jobs submitted before the cluster's (they take the ids before its own)."""
    expected = next_job_id(slurm) + later
    base = 20000 + (expected % 90) * 128  # the block the job id picks (spec defaults)
    worker = slurm.nodes[1]
    holder = worker.popen(["python3", "-c", (
        "import socket, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('0.0.0.0', {base + 3})); s.listen(); time.sleep(600)")],
        log=tmp_path / "holder.log")
    cluster_name = slurm.run("scontrol show config | awk '/^ClusterName/ {print $3}'",
                             check=True).stdout.strip()
    planted = [Path(f"/tmp/rf-{cluster_name[:10]}-{expected}.{k}") for k in (0, 1)]
    for folder in planted:
        folder.mkdir(mode=0o777)
        (folder / "rf_helper.py").write_text("raise SystemExit('planted helper ran')\n")
    try:
        wait_until(lambda: worker.run(f"ss -ltn 'sport = :{base + 3}' | grep -q LISTEN")
                   .returncode == 0, "the port holder to listen", timeout=30, interval=0.2)
        yield Squat(expected, base, worker, planted)
    finally:
        holder.terminate()
        holder.wait(timeout=10)
        for folder in planted:
            (folder / "rf_helper.py").unlink()
            folder.rmdir()


def _check_squat_avoided(squat: Squat, job: dict[str, Any]) -> None:
    """The job got the predicted id and block, yet neither the held port nor a planted dir; its
    temp dir is private: 0700, though Ray widens its own temp dir (<dir>/ray) to 0777."""
    assert int(job["job_id"]) == squat.expected and job["port_base"] == squat.base
    ports = {n["hostname"]: n["node_manager_port"] for n in job["nodes"]}
    assert ports[squat.worker.hostname] != squat.base + 3, "the worker took the other user's port"
    for folder in squat.planted:
        assert [p.name for p in folder.iterdir()] == ["rf_helper.py"], "a planted dir was used"
    assert not str(job["temp_dir"]).startswith(tuple(str(p) for p in squat.planted))
    mode = squat.worker.run(f"stat -c %a {job['temp_dir']}", check=True).stdout.strip()
    assert mode == "700", (job["temp_dir"], mode)


def test_two_nodes_through_the_login_host_queued_across_a_controller_restart(
        tmp_path: Path, rf_home: Path, slurm_cluster: SlurmCluster, torn_down: Register) -> None:
    """One heterogeneous 2-node cluster (a CPU group and a `gpu_workers` group, a node each) for
    every concern of a whole life here: one `up` of this bed costs the 2-core CI machine tens of
    CPU-seconds, so the queued `up` across a controller restart, the shared nodes, tracking,
    Serve, the dashboard tunnel, the end by `scancel` and the teardown after it share one."""
    spec = torn_down(login_spec(
        tmp_path, slurm_cluster, "duo",
        "tracking: mlflow\n"
        "gpu_workers: {nodes: 1, cpus_per_node: 1, resources: {gpu_node: 1}}\n"))
    # Up on shared nodes: someone else holds a port of the job's block and planted its temp dirs;
    # and the job queues behind another user's (which takes the id before it) while slurmctld
    # goes away and comes back.
    with _squatted(tmp_path, slurm_cluster, later=1) as squat:
        _up_across_a_controller_restart(spec, rf_home, slurm_cluster)
        job = job_of(rf_home, "duo")
        hostnames = sorted(h.hostname or "" for h in slurm_cluster.nodes)
        assert sorted(n["hostname"] for n in job["nodes"]) == hostnames
        rows = slurm_cluster.run(f"squeue -h -j {job['job_id']} -o '%i %T'",
                                 check=True).stdout.split()
        assert rows == [f"{job['job_id']}+0", "RUNNING", f"{job['job_id']}+1", "RUNNING"]

        status = json.loads(ok(invoke("status", "--cluster", str(spec), "--json")))
        assert status["running"] and status["resources"]["CPU"] == 2
        assert status["resources"]["gpu_node"] == 1
        assert [n["state"] for n in status["nodes"]] == ["ALIVE", "ALIVE"]
        _check_squat_avoided(squat, job)
    # One Ray job for both: tasks run on both hosts (a task pinned to each node; Ray spreading
    # a plain job over a Slurm cluster's hosts: test_e2e_autoscale.py's
    # test_scale_from_zero_runs_the_job_on_both_hosts_then_the_idle_worker_goes), and the
    # worker's MLflow run lands in the head's server.
    tracked = _check_tracking(tmp_path, rf_home, spec, job)
    assert tracked["hosts"] == hostnames, "tasks must run on both hosts"
    _check_serve(tmp_path, spec)
    _check_no_secret_shown(rf_home, spec, slurm_cluster)
    assert f"RF_CLUSTER_ID={job['cluster_id']}" in _job_environments(slurm_cluster,
                                                                      str(job["job_id"]))

    # `invoke dashboard` keeps a tunnel through the login host open until Ctrl+C.
    env = {"PATH": f"{ray_bin_dir()}:/usr/bin:/bin"}
    tunnel = subprocess.Popen([sys.executable, "-m", "invoke", "dashboard", "--cluster", str(spec)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**__import__("os").environ, **env})
    try:
        assert tunnel.stdout is not None
        url = tunnel.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        assert requests.get(f"{url}/api/jobs/", timeout=10).status_code == 401
        token = auth.headers(rf_home / "keys" / "duo" / "ray-token")
        jobs = requests.get(f"{url}/api/jobs/", headers=token, timeout=10).json()
        assert [j["status"] for j in jobs] == ["SUCCEEDED"]
        # What the dashboard shows of the jobs holds no MLflow login.
        password = (rf_home / "keys" / "duo" / "mlflow-password").read_text().strip()
        assert password not in json.dumps(jobs)
    finally:
        tunnel.send_signal(signal.SIGINT)
        tunnel.wait(timeout=30)

    # What the batch script does on scancel (not only what `invoke teardown` checks afterwards):
    # every node's Ray is gone within Slurm's KillWait. Both groups run the same node script.
    assert set(ray_left_on_hosts(slurm_cluster, job)) == {h.name for h in slurm_cluster.nodes}
    started = time.monotonic()
    slurm_cluster.run(f"scancel {job['job_id']}", check=True)
    slurm_cluster.wait_job(job["job_id"], timeout=60)
    gone_after = time.monotonic() - started
    assert ray_left_on_hosts(slurm_cluster, job) == {}
    assert gone_after < 5, f"the job took {gone_after:.1f}s to stop (KillWait is 5 s)"
    # A cluster cancelled outside rayfleet still tears down cleanly, its tracking store kept.
    said = ok(invoke("teardown", "--cluster", str(spec)))
    _check_store_kept(slurm_cluster, spec, tracked, said)
    assert slurm_cluster.job_state(job["job_id"]) is None
    assert not list((rf_home / "state").glob("duo*.json"))
    assert not list(slurm_cluster.jobs_dir.glob(f"{job['name']}.*"))


def _job_states(slurm: SlurmCluster, job_id: str) -> set[str]:
    """The states squeue shows for a job's rows (a heterogeneous job has one per group)."""
    return set(slurm.run(f"squeue -h -j {job_id} -o %T", timeout=30).stdout.split())


def _up_across_a_controller_restart(spec: Path, rf_home: Path, slurm: SlurmCluster) -> None:
    """`up` of `spec` while both nodes are busy, so that its job queues; slurmctld goes away
    while it is queued and comes back: a failing squeue never cancels the queued job, and `up`
    returns once the nodes are free and the job runs."""
    blocker = slurm.sbatch("#!/bin/bash\nsleep 600\n", "--nodes=2", "--exclusive",
                           "--output=/dev/null")
    slurm.wait_job(blocker, {"RUNNING"})
    env = {**os.environ, "PATH": f"{ray_bin_dir()}:{os.environ['PATH']}"}
    up = subprocess.Popen([sys.executable, "-m", "invoke", "up", "--cluster", str(spec)], env=env,
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # `up`'s output as it comes: its failed polls ("...; retrying") are the state waited for.
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(up.stdout or ()), daemon=True)
    reader.start()
    try:
        def recorded_job() -> str | None:
            assert up.poll() is None, "".join(lines)
            jobs = (read_json(rf_home / "state" / f"{spec.stem}.json") or {}).get("resources")
            return jobs[0]["attrs"].get("job_id") if jobs else None

        job_id = wait_until(recorded_job, "up to record its job id", timeout=120, interval=0.2)

        def pending() -> bool:
            return _job_states(slurm, job_id) == {"PENDING"}

        wait_until(pending, "the job to queue", timeout=60, interval=0.2)
        slurm.testbed.client.run(f"kill -TERM $(cat {slurm.workdir / 'slurmctld.pid'})",
                                 check=True)
        wait_until(lambda: slurm.run("squeue -h", timeout=30).returncode != 0,
                   "slurmctld to stop", timeout=30, interval=0.2)
        # `up` saw a poll fail and said it keeps on (it says so once: the same words are not
        # repeated). Then several more polls fail: it polls every 0.5 s, so 3 s after the first
        # failure is at least four more.
        wait_until(lambda: any("; retrying" in line for line in list(lines)),
                   "up to report a failed poll", timeout=120, interval=0.2)
        time.sleep(3)
        assert up.poll() is None, "up gave up while squeue failed"
        slurm.testbed.client.popen(["slurmctld", "-D", "-f", str(slurm.conf_path)],
                                   log=slurm.workdir / "slurmctld-restarted.out", env=slurm.env)
        wait_until(pending, "the job still queued after the restart", timeout=60, interval=0.2)
        slurm.run(f"scancel {blocker}", check=True)
        up.wait(timeout=300)
        reader.join(timeout=30)
        assert up.returncode == 0, "".join(lines)
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(timeout=30)
        slurm.run(f"scancel {blocker}")
        slurm.wait_job(blocker, timeout=60)


def test_more_nodes_than_the_partition_has_is_one_line(tmp_path: Path, rf_home: Path,
                                                       slurm_cluster: SlurmCluster) -> None:
    spec = login_spec(tmp_path, slurm_cluster, "toobig", "nodes: 3\n")
    line = one_line_error(invoke("up", "--cluster", str(spec)), 2)
    assert line.endswith("nodes: 3 nodes requested but partition 'debug' has 2; lower it or pick "
                         "a bigger partition"), line


def test_bench_slurm_up_measures_both_arms_at_one_node_on_this_bed(
        tmp_path: Path, rf_home: Path, slurm_cluster: SlurmCluster) -> None:
    """bench/slurm_up.py's quick run (one node, each arm once) on this module's bed
    (tests/test_bench.py's ON_E2E: a bed of its own would repeat this module's)."""
    env = {**os.environ, "PATH": f"{ray_bin_dir()}:{os.environ.get('PATH', '')}",
           "RAY_USAGE_STATS_ENABLED": "0", "RAYFLEET_HOME": str(rf_home)}
    # Without the Prometheus a spec runs by default: the bench times Ray's nodes alive (its
    # recipe runs none), and `metrics: prometheus` is tested in test_e2e_autoscale.py.
    ours = slurm_up.run_ours(slurm_cluster, tmp_path, 1, env, "metrics: none\n")
    recipe = slurm_up.run_recipe(slurm_cluster, 1)
    print(f"bench/slurm_up.py, 1 node: rayfleet {ours['alive']:.1f}s to {ours['nodes']} alive "
          f"(invoke up {ours['up']:.1f}s) | recipe {recipe['alive']:.1f}s "
          f"({recipe['nodes']} alive then); ratio {ours['alive'] / recipe['alive']:.2f}")
    assert ours["nodes"] == 1 and ours["alive"] > 0 and ours["up"] > 0
    assert recipe["alive"] > 0
    # rayfleet's arm was torn down (the recipe's job is cancelled and waited for by the bench).
    assert not list((rf_home / "state").glob("bench1*.json"))


def test_an_unknown_compute_node_key_stops_up_in_one_line_and_cancels_the_job(
        tmp_path: Path, rf_home: Path, slurm_cluster: SlurmCluster, torn_down: Register) -> None:
    # The login host is known, the compute node the head lands on is not: the dashboard tunnel
    # into it must refuse, `up` must fail in one line naming it and cancel exactly its job.
    login, node = slurm_cluster.nodes
    known = tmp_path / "known_hosts"
    lines = slurm_cluster.testbed.known_hosts_path.read_text().splitlines()
    known.write_text("".join(f"{line}\n" for line in lines if line.split()[0] == login.ip))
    spec = torn_down(login_spec(tmp_path, slurm_cluster, "pinned",
                                f"extra_sbatch_options: [--nodelist={node.hostname}]\n"))
    spec.write_text(spec.read_text().replace(str(slurm_cluster.testbed.known_hosts_path),
                                             str(known)))
    line = one_line_error(invoke("up", "--cluster", str(spec)), 1)
    assert node.ip in line and "known_hosts" in line, line
    # Cancelled and forgotten (core removes a first up's state that holds nothing).
    state_file = rf_home / "state" / "pinned.json"
    assert not state_file.exists() or json.loads(state_file.read_text())["resources"] == []
    assert "rf-pinned-" not in slurm_cluster.run("squeue -h -o '%j'", check=True).stdout
    assert list(slurm_cluster.jobs_dir.glob("rf-pinned-*")) == [], "the job's files remain"
    # No token left on the shared disk (the earlier tests of the session tore theirs down).
    assert list(slurm_cluster.jobs_dir.glob("keys/*/ray-token")) == []


def test_a_changed_login_host_key_stops_in_one_line(tmp_path: Path, rf_home: Path,
                                                   slurm_cluster: SlurmCluster) -> None:
    login, other = slurm_cluster.nodes
    lines = slurm_cluster.testbed.known_hosts_path.read_text().splitlines()
    # The login host's address with another host's key: what a replaced (or spoofed) host shows.
    foreign = next(line for line in lines if line.split()[0] == other.ip).split(None, 1)[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"{login.ip} {foreign}\n")
    spec = login_spec(tmp_path, slurm_cluster, "spoofed", "")
    spec.write_text(spec.read_text().replace(str(slurm_cluster.testbed.known_hosts_path),
                                             str(known)))
    for verb in ("plan", "up"):
        line = one_line_error(invoke(verb, "--cluster", str(spec)), 1)
        assert login.ip in line and "CHANGED" in line, line
    assert slurm_cluster.run("squeue -h -o '%j'", check=True).stdout.count("rf-spoofed-") == 0

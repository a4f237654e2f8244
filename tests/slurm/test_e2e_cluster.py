"""The Slurm provider on the 2-host test bed, as an HPC user runs it: Slurm commands over SSH on the
login host, compute nodes reachable only through it, the dashboard through an SSH tunnel.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from infra import auth
from tests.conftest import ROOT
from tests.slurm.conftest import (
    Register,
    invoke,
    job_of,
    login_spec,
    ok,
    one_line_error,
    ray_left_on_hosts,
    result_of,
)
from tests.testbed.hosts import ray_bin_dir
from tests.testbed.slurm import SlurmCluster

pytestmark = pytest.mark.slow


def test_two_nodes_through_the_login_host(tmp_path: Path, rf_home: Path,
                                          slurm_cluster: SlurmCluster, torn_down: Register) -> None:
    spec = torn_down(login_spec(tmp_path, slurm_cluster, "duo", "nodes: 2\n"))
    ok(invoke("up", "--cluster", str(spec)))
    job = job_of(rf_home, "duo")
    hostnames = sorted(h.hostname or "" for h in slurm_cluster.nodes)
    assert sorted(n["hostname"] for n in job["nodes"]) == hostnames
    assert slurm_cluster.job_state(job["job_id"]) == "RUNNING"

    status = json.loads(ok(invoke("status", "--cluster", str(spec), "--json")))
    assert status["running"] and status["resources"]["CPU"] == 2
    assert [n["state"] for n in status["nodes"]] == ["ALIVE", "ALIVE"]

    # Enough tasks that the second node takes some while the first is busy.
    result = result_of(ok(invoke("submit", "--cluster", str(spec), "examples/cpu_example.py",
                                 "--", "200")))
    assert result["hosts"] == hostnames, "tasks must run on both hosts"

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
        assert len(jobs) == 1 and jobs[0]["status"] == "SUCCEEDED"
    finally:
        tunnel.send_signal(signal.SIGINT)
        tunnel.wait(timeout=30)

    ok(invoke("teardown", "--cluster", str(spec)))
    assert slurm_cluster.job_state(job["job_id"]) is None
    assert ray_left_on_hosts(slurm_cluster, job) == {}
    assert not list(slurm_cluster.jobs_dir.glob(f"{job['name']}.*"))


def test_heterogeneous_job_joins_both_groups_in_one_ray_cluster(
        tmp_path: Path, rf_home: Path, slurm_cluster: SlurmCluster, torn_down: Register) -> None:
    spec = torn_down(login_spec(
        tmp_path, slurm_cluster, "hetero",
        "gpu_workers: {nodes: 1, cpus_per_node: 1, resources: {gpu_node: 1}}\n"))
    ok(invoke("up", "--cluster", str(spec)))
    job = job_of(rf_home, "hetero")
    rows = slurm_cluster.run(f"squeue -h -j {job['job_id']} -o '%i %T'", check=True).stdout.split()
    assert rows == [f"{job['job_id']}+0", "RUNNING", f"{job['job_id']}+1", "RUNNING"]
    status = json.loads(ok(invoke("status", "--cluster", str(spec), "--json")))
    assert status["resources"]["CPU"] == 2 and status["resources"]["gpu_node"] == 1
    ok(invoke("teardown", "--cluster", str(spec)))
    assert slurm_cluster.job_state(job["job_id"]) is None
    assert ray_left_on_hosts(slurm_cluster, job) == {}


def test_more_nodes_than_the_partition_has_is_one_line(tmp_path: Path, rf_home: Path,
                                                       slurm_cluster: SlurmCluster) -> None:
    spec = login_spec(tmp_path, slurm_cluster, "toobig", "nodes: 3\n")
    line = one_line_error(invoke("up", "--cluster", str(spec)), 2)
    assert line.endswith("nodes: 3 nodes requested but partition 'debug' has 2; lower it or pick "
                         "a bigger partition"), line


def test_cancelling_the_job_stops_its_ray_on_every_node_quickly(
        tmp_path: Path, rf_home: Path, slurm_cluster: SlurmCluster, torn_down: Register) -> None:
    # What the batch script does on scancel (not only what `invoke teardown` checks afterwards).
    spec = torn_down(login_spec(tmp_path, slurm_cluster, "quick", "nodes: 2\n"))
    ok(invoke("up", "--cluster", str(spec)))
    job = job_of(rf_home, "quick")
    assert set(ray_left_on_hosts(slurm_cluster, job)) == {h.name for h in slurm_cluster.nodes}
    started = time.monotonic()
    slurm_cluster.run(f"scancel {job['job_id']}", check=True)
    slurm_cluster.wait_job(job["job_id"], timeout=60)
    gone_after = time.monotonic() - started
    assert ray_left_on_hosts(slurm_cluster, job) == {}
    assert gone_after < 5, f"the job took {gone_after:.1f}s to stop (KillWait is 5 s)"
    ok(invoke("teardown", "--cluster", str(spec)))

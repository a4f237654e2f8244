"""The Slurm provider against real Slurm on 127.0.0.1 (one node): up, submit, status, teardown.

Slurm here runs its jobs in a PID namespace of its own, which this process can still see, so the
tests look for the job's Ray processes directly (by the job's private temp dir in command lines).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests

from infra.core import auth
from infra.core.state import State
from infra.node import rayproc
from infra.providers.slurm.records import Job
from tests.slurm.conftest import (
    Register,
    invoke,
    job_of,
    local_spec,
    ok,
    one_line_error,
    result_of,
    state_empty,
)
from tests.testbed.slurm import LocalSlurm

pytestmark = pytest.mark.slow


def ray_processes(job: dict[str, object]) -> list[int]:
    """PIDs of the job's Ray processes on this machine (its head's temp dir and descendants)."""
    return rayproc.cluster_processes([str(job["temp_dir"])])


def squeue(slurm: LocalSlurm) -> str:
    return slurm.run("squeue -h -o '%i %j %T'", check=True).stdout.strip()


@pytest.mark.parametrize(("extra", "field", "words"), [
    ("partition: debgu\n", "partition", "unknown partition 'debgu' on this machine; did you mean "
                                         "'debug'?"),
    ("nodes: 2\n", "nodes", "2 nodes requested but partition 'debug' has 1"),
    ("cpus_per_node: 64\n", "cpus_per_node", "64 CPUs per node requested but no node of "
                                              "partition 'debug' has that many (the largest has"),
    ("gpus_per_node: 1\n", "gpus_per_node", "1 GPUs per node requested but no node"),
])
def test_specs_the_cluster_cannot_run_fail_in_one_line_before_sbatch(
        tmp_path: Path, rf_home: Path, slurm_local: LocalSlurm, extra: str, field: str,
        words: str) -> None:
    spec = local_spec(tmp_path, slurm_local, "bad", extra)
    before = squeue(slurm_local)
    for verb in ("plan", "up"):
        line = one_line_error(invoke(verb, "--cluster", str(spec)), 2)
        assert f"{spec}: {field}: " in line and words in line, line
    assert squeue(slurm_local) == before, "nothing may be submitted"
    assert state_empty(rf_home, "bad")


def test_up_submit_status_teardown_and_two_clusters_share_a_node(
        tmp_path: Path, rf_home: Path, slurm_local: LocalSlurm, torn_down: Register) -> None:
    """A single-node cluster's whole life (alpha), with a second one (beta) on the same node that
    alpha's teardown must not touch: one `up` fewer than a test of each (~35 s of CI)."""
    first, second = (torn_down(local_spec(tmp_path, slurm_local, name))
                     for name in ("alpha", "beta"))
    out = ok(invoke("up", "--cluster", str(first)))
    a = job_of(rf_home, "alpha")
    assert re.search(r"dashboard:\s+http://127\.0\.0\.1:\d+", out), out
    assert slurm_local.job_state(a["job_id"]) == "RUNNING"
    assert ray_processes(a), "Ray of the job is not running"

    # A second `up` finds the running job instead of submitting another.
    ok(invoke("up", "--cluster", str(first)))
    assert job_of(rf_home, "alpha")["job_id"] == a["job_id"]

    ok(invoke("up", "--cluster", str(second)))
    b = job_of(rf_home, "beta")
    assert a["port_base"] != b["port_base"] and a["temp_dir"] != b["temp_dir"]

    # With beta on the same node, alpha's status still shows alpha's job and Ray alone.
    status = json.loads(ok(invoke("status", "--cluster", str(first), "--json")))
    assert status["running"] and f"Slurm job {a['job_id']} RUNNING" in status["summary"]
    assert "of 1:00:00" in status["summary"], "elapsed of the time limit"
    assert status["resources"]["CPU"] == 1 and [n["state"] for n in status["nodes"]] == ["ALIVE"]

    result = result_of(ok(invoke("submit", "--cluster", str(first), "examples/cpu_example.py",
                                 "--", "4")))
    assert result["tasks"] == 4 and len(result["nodes"]) == 1
    assert result_of(ok(invoke("submit", "--cluster", str(second), "examples/cpu_example.py",
                               "--", "2")))["tasks"] == 2
    b_pids = ray_processes(b)
    assert b_pids

    ok(invoke("teardown", "--cluster", str(first)))
    assert slurm_local.job_state(a["job_id"]) is None, "the job is still in the queue"
    assert ray_processes(a) == [], "Ray processes of the job survived"
    assert not Path(str(a["temp_dir"])).exists()
    assert state_empty(rf_home, "alpha")
    assert not list(slurm_local.jobs_dir.glob(f"{a['name']}.*")), "job files left behind"
    assert "Ray nodes alive" in (rf_home / "logs" / "alpha" / f"slurm-{a['job_id']}.out").read_text()
    assert slurm_local.job_state(b["job_id"]) == "RUNNING"
    assert all(rayproc.alive(pid) for pid in b_pids), "tearing down alpha hurt beta"
    url = f"http://127.0.0.1:{b['dashboard_port']}/api/jobs/"
    assert requests.get(url, timeout=5).status_code == 401, "token auth is on"
    token = auth.headers(rf_home / "keys" / "beta" / "ray-token")
    assert requests.get(url, headers=token, timeout=5).ok
    # Safe twice.
    assert "nothing to tear down" in ok(invoke("teardown", "--cluster", str(first)))
    ok(invoke("teardown", "--cluster", str(second)))
    assert ray_processes(b) == []


def test_teardown_finds_a_job_whose_id_was_never_recorded(
        tmp_path: Path, rf_home: Path, slurm_local: LocalSlurm, torn_down: Register) -> None:
    # What a crash between sbatch and reading its answer leaves: the job name, no job id.
    spec = torn_down(local_spec(tmp_path, slurm_local, "crashed"))
    state = State.new(rf_home / "state" / "crashed.json", "crashed", "slurm")
    state.add("rf-crashed-0a1b2c", Job(workdir=str(slurm_local.jobs_dir)))
    job_id = slurm_local.sbatch("#!/bin/bash\nsleep 600\n", "--job-name=rf-crashed-0a1b2c",
                                "--output=/dev/null")
    slurm_local.wait_job(job_id, {"RUNNING"})
    ok(invoke("teardown", "--cluster", str(spec)))
    assert slurm_local.job_state(job_id) is None
    assert state_empty(rf_home, "crashed")


def test_a_node_that_cannot_start_ray_fails_up_in_one_line_and_cancels(
        tmp_path: Path, rf_home: Path, slurm_local: LocalSlurm, torn_down: Register) -> None:
    spec = torn_down(local_spec(tmp_path, slurm_local, "broken",
                                "environment: {modules: [nosuch/1.0]}\n"))
    line = one_line_error(invoke("up", "--cluster", str(spec)), 1)
    assert "before Ray was ready" in line and "module load nosuch/1.0 failed" in line, line
    assert "rf-broken-" not in squeue(slurm_local)
    # A cancelled job leaves the state (core removes a first up's state that holds nothing).
    state_file = rf_home / "state" / "broken.json"
    assert state_empty(rf_home, "broken") or json.loads(state_file.read_text())["resources"] == []

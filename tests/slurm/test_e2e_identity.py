"""A Slurm cluster on shared nodes and a shaky controller (issue 10), and pinned host keys for the
compute nodes (issue 11), on the 2-host test bed through its login host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

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
from tests.waiting import read_json, wait_until

pytestmark = pytest.mark.slow


def next_job_id(slurm: SlurmCluster) -> int:
    """The id Slurm gives the next job (this session submits one job at a time)."""
    probe = slurm.sbatch("#!/bin/bash\ntrue\n", "--output=/dev/null")
    slurm.wait_job(probe, timeout=60)
    return int(probe) + 1


def test_a_port_taken_on_a_worker_and_a_planted_dir_do_not_break_the_cluster(
        tmp_path: Path, rf_home: Path, slurm_cluster: SlurmCluster, torn_down: Register) -> None:
    expected = next_job_id(slurm_cluster)
    base = 20000 + (expected % 90) * 128  # the block the job id picks (spec defaults)
    worker = slurm_cluster.nodes[1]
    # Someone else's process holds the job's node-manager port on the second host only.
    holder = worker.popen(["python3", "-c", (
        "import socket, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('0.0.0.0', {base + 3})); s.listen(); time.sleep(600)")],
        log=tmp_path / "holder.log")
    # Another user planted directories where the old scheme put this job's temp dirs (/tmp is
    # shared by the test bed's hosts), with a "helper" in them.
    cluster_name = slurm_cluster.run("scontrol show config | awk '/^ClusterName/ {print $3}'",
                                     check=True).stdout.strip()
    planted = [Path(f"/tmp/rf-{cluster_name[:10]}-{expected}.{k}") for k in (0, 1)]
    for folder in planted:
        folder.mkdir(mode=0o777)
        (folder / "rf_helper.py").write_text("raise SystemExit('planted helper ran')\n")
    try:
        wait_until(lambda: worker.run(f"ss -ltn 'sport = :{base + 3}' | grep -q LISTEN")
                   .returncode == 0, "the port holder to listen", timeout=30, interval=0.2)
        spec = torn_down(login_spec(tmp_path, slurm_cluster, "shared", "nodes: 2\n"))
        ok(invoke("up", "--cluster", str(spec)))
        job = job_of(rf_home, "shared")
        assert int(job["job_id"]) == expected and job["port_base"] == base
        ports = {n["hostname"]: n["node_manager_port"] for n in job["nodes"]}
        assert ports[worker.hostname] != base + 3, "the worker took the other user's port"
        assert result_of(ok(invoke("submit", "--cluster", str(spec), "examples/cpu_example.py",
                                   "--", "200")))["hosts"] == sorted(ports)
        for folder in planted:
            assert [p.name for p in folder.iterdir()] == ["rf_helper.py"], "a planted dir was used"
        assert not str(job["temp_dir"]).startswith(tuple(str(p) for p in planted))
        # Private: 0700, though Ray widens its own temp dir (<dir>/ray) to 0777.
        mode = worker.run(f"stat -c %a {job['temp_dir']}", check=True).stdout.strip()
        assert mode == "700", (job["temp_dir"], mode)
        ok(invoke("teardown", "--cluster", str(spec)))
        assert ray_left_on_hosts(slurm_cluster, job) == {}
    finally:
        holder.terminate()
        holder.wait(timeout=10)
        for folder in planted:
            (folder / "rf_helper.py").unlink()
            folder.rmdir()


def test_a_failing_squeue_never_cancels_a_queued_job(
        tmp_path: Path, rf_home: Path, slurm_cluster: SlurmCluster, torn_down: Register) -> None:
    # Both nodes busy: our job queues. Then slurmctld goes away for a while and comes back.
    blocker = slurm_cluster.sbatch("#!/bin/bash\nsleep 600\n", "--nodes=2", "--exclusive",
                                   "--output=/dev/null")
    slurm_cluster.wait_job(blocker, {"RUNNING"})
    spec = torn_down(login_spec(tmp_path, slurm_cluster, "queued", ""))
    env = {**os.environ, "PATH": f"{ray_bin_dir()}:{os.environ['PATH']}"}
    up = subprocess.Popen([sys.executable, "-m", "invoke", "up", "--cluster", str(spec)], env=env,
                          cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    # `up`'s output as it comes: its failed polls ("...; retrying") are the state waited for.
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(up.stdout or ()), daemon=True)
    reader.start()
    try:
        state_file = rf_home / "state" / "queued.json"

        def recorded_job() -> str | None:
            assert up.poll() is None, "".join(lines)
            jobs = (read_json(state_file) or {}).get("resources")
            return jobs[0]["attrs"].get("job_id") if jobs else None

        job_id = wait_until(recorded_job, "up to record its job id", timeout=120, interval=0.2)
        slurm_cluster.wait_job(job_id, {"PENDING"})
        client = slurm_cluster.testbed.client
        pid_file = slurm_cluster.workdir / "slurmctld.pid"
        client.run(f"kill -TERM $(cat {pid_file})", check=True)
        wait_until(lambda: slurm_cluster.run("squeue -h", timeout=30).returncode != 0,
                   "slurmctld to stop", timeout=30, interval=0.2)
        # `up` saw a poll fail and said it keeps on (it says so once: the same words are not
        # repeated). Then several more polls fail: it polls every 0.5 s, so 3 s after the first
        # failure is at least four more.
        wait_until(lambda: any("; retrying" in line for line in list(lines)),
                   "up to report a failed poll", timeout=120, interval=0.2)
        time.sleep(3)
        assert up.poll() is None, "up gave up while squeue failed"
        client.popen(["slurmctld", "-D", "-f", str(slurm_cluster.conf_path)],
                     log=slurm_cluster.workdir / "slurmctld-restarted.out", env=slurm_cluster.env)
        slurm_cluster.wait_job(job_id, {"PENDING"}, timeout=60)
        slurm_cluster.run(f"scancel {blocker}", check=True)
        up.wait(timeout=300)
        reader.join(timeout=30)
        out = "".join(lines)
        assert up.returncode == 0, out
        assert slurm_cluster.job_state(job_id) == "RUNNING"
        ok(invoke("teardown", "--cluster", str(spec)))
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(timeout=30)
        slurm_cluster.run(f"scancel {blocker}")
        slurm_cluster.wait_idle(timeout=60)


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

"""Autoscaling on Slurm: from demand to the worker joined, next to what Slurm and Ray need anyway.

On the test bed's 2-node Slurm (through its login host over SSH), one autoscaling cluster (head on
one host, worker type `cpu` 0..1 on the other), alternating per rep:

- rayfleet: a job asks for a 2-node placement group (the head has one node); measured from that
  request to the group being placed (the autoscaler saw the demand, submitted a worker job, Slurm
  started it, Ray started on it and joined), read from the job's own clock. Then the worker is
  left to go idle and be cancelled before the next rep.
- bare: the same Slurm's `sbatch` of a one-line job on the free host, from the sbatch call to a
  plain `ray start --address=<head> --block` printing that the node started (Ray's own start).

Prints one line per rep and the ratio of medians. Target: <= 1.2.
Usage: python bench/slurm_autoscale.py [--reps 3] [--quick]   (root; needs the test bed's packages)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from tests.testbed.hosts import ray_bin_dir  # noqa: E402
from tests.testbed.slurm import SlurmCluster  # noqa: E402

SPEC = """provider: slurm
submit:
  host: {login.ip}
  user: {login.ssh_user}
  key: {login.ssh_key_path}
  proxy_command: {proxy}
  known_hosts: {known_hosts}
  workdir: {workdir}
cpus_per_node: 1
object_store_memory_mb: 100
exclusive: true
idle_timeout_minutes: 0.1
worker_types:
  cpu: {{cpus_per_node: 1, max_workers: 1}}
"""

BARE = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --exclusive
#SBATCH --output=bare-%j.out
export RAY_USAGE_STATS_ENABLED=0 RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token}
# Without --temp-dir a worker's Ray uses the head's temp path. On a site that path is on this
# node's own disk; the test bed's hosts share /tmp (only /tmp/ray is each host's own), so the
# default would put this node's runtime-env agent in the head's folder, where it deletes and
# re-downloads the head's unpacked working_dir packages, and the scancel below can leave them gone.
ray start --address={address} --temp-dir=/tmp/ray --num-cpus=1 --object-store-memory=100000000 \
  --block 2>&1 |
  while IFS= read -r line; do
    case $line in *"Ray runtime started"*) date +%s.%N > bare-$SLURM_JOB_ID.started;; esac
  done
"""


def invoke(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"invoke {' '.join(args[:1])} failed: {done.stderr.strip()[-600:]}")
    return done.stdout


def worker_jobs(cluster: SlurmCluster, cluster_id: str) -> list[str]:
    out = cluster.run("squeue -h -o '%i|%k'", check=True).stdout
    return [line.split("|")[0] for line in out.splitlines()
            if f"rayfleet-cluster={cluster_id}" in line and "role=worker" in line]


def wait(what: str, check: object, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def run_ours(env: dict[str, str], spec: Path) -> tuple[float, dict[str, Any]]:
    """A job asking for a 2-node placement group on the cluster with its head alone: seconds
    from its demand to the group placed (the job's own clock), and what the job printed.
    tests/slurm/test_e2e_autoscale.py runs both arms on its own cluster (so CI measures there,
    not on a bed of its own)."""
    out = invoke(env, "submit", "--cluster", str(spec), "tests/data/spread_job.py", "--", "2")
    result = json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:])
    return float(result["ready_at"] - result["demand_at"]), result


def run_bare(cluster: SlurmCluster, address: str, token: Path) -> float:
    """Seconds from `sbatch` of a plain `ray start` on the free host to Ray's start there."""
    started = time.time()
    job_id = cluster.sbatch(BARE.format(address=address, token=token))
    marker = cluster.jobs_dir / f"bare-{job_id}.started"
    # Waited for with its time in it: the shell creates the file before `date` has written.
    wait("the bare worker's `ray start`", lambda: marker.exists() and marker.read_text().strip(),
         timeout=300)
    seconds = float(marker.read_text()) - started
    cluster.run(f"scancel {job_id}", check=True)
    cluster.wait_job(job_id, timeout=60)
    return seconds


def main() -> None:
    args = common.options(__doc__, 3, raw=True)
    work, env = common.slurm_scratch("rf-slurm-autoscale-bench-")
    env["PATH"] = f"{ray_bin_dir()}:{os.environ['PATH']}"
    ours: list[float] = []
    bare: list[float] = []
    with SlurmCluster(2, work / "slurm") as cluster:
        login = cluster.login_host
        spec = work / "elastic.yaml"
        spec.write_text(SPEC.format(login=login, proxy=cluster.testbed.proxy_command,
                                    known_hosts=cluster.testbed.known_hosts_path,
                                    workdir=cluster.jobs_dir))
        print(f"2-node Slurm test bed up in {cluster.timings['up']}s; machine: "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
        invoke(env, "up", "--cluster", str(spec))
        try:
            state = json.loads((work / "home" / "state" / "elastic.json").read_text())
            cluster_id = state["cluster_id"]
            head = state["resources"][0]["attrs"]
            address = f"{head['head_ip']}:{head['gcs_port']}"
            token = cluster.jobs_dir / "keys" / cluster_id / "ray-token"
            for rep in range(args.reps):
                wait("no worker job", lambda: not worker_jobs(cluster, cluster_id))
                ours.append(run_ours(env, spec)[0])
                wait("the idle worker's job to be cancelled",
                     lambda: not worker_jobs(cluster, cluster_id))
                bare.append(run_bare(cluster, address, token))
                print(f"rep {rep + 1}: rayfleet demand -> worker joined {ours[-1]:.1f}s | bare "
                      f"sbatch -> running + ray start {bare[-1]:.1f}s", flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "invoke", "teardown", "--cluster", str(spec)],
                           cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    ratio = statistics.median(ours) / statistics.median(bare)
    print(f"\nmedian seconds: rayfleet {statistics.median(ours):.1f}, bare "
          f"{statistics.median(bare):.1f}; ratio {ratio:.2f} (target <= 1.2)")


if __name__ == "__main__":
    main()

"""Slurm's autodown action (infra/autodown.py): the head cancels its worker jobs, then its own job.

Runs inside the head's job on a compute node, with the Slurm client commands of that node. Jobs are
chosen by the cluster id in their name or comment (what rayfleet submits carries it), and only the
user's own (`squeue --me`). The head's job goes last: cancelling it ends this watcher too, so the
marker says "removing" (with the time) before that, which the laptop reads as removed once Slurm
no longer lists the job.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from typing import Any


def _ours(cluster_id: str) -> list[str]:
    """Ids of this user's queued or running jobs whose name or comment carries `cluster_id`."""
    for attempt in range(5):
        done = subprocess.run(["squeue", "--me", "--noheader", "--format=%i|%j|%k"],
                              capture_output=True, text=True, check=False, timeout=60)
        if done.returncode == 0:
            break
        time.sleep(2 ** attempt)  # slurmctld busy: a failed squeue is never "no jobs"
    else:
        raise RuntimeError(f"squeue keeps failing: {done.stderr.strip()[:200]}")
    jobs = []
    for line in done.stdout.splitlines():
        job_id, _, rest = line.partition("|")
        if cluster_id in rest:
            jobs.append(job_id.strip())
    return jobs


def remove(args: dict[str, Any], log: Callable[[str], None]) -> None:
    cluster_id = str(args["cluster_id"])
    head = str(args.get("head_job_id") or os.environ.get("SLURM_JOB_ID") or "")
    if not head:
        raise RuntimeError("no head job id (SLURM_JOB_ID unset and none in the config)")
    wait_s = float(args.get("wait_s") or 300)
    workers = [j for j in _ours(cluster_id) if j.split("_")[0] != head]
    if workers:
        log(f"cancelling {len(workers)} worker job(s): {', '.join(workers)}")
        subprocess.run(["scancel", *workers], check=False, timeout=60)
        deadline = time.monotonic() + wait_s
        while [j for j in _ours(cluster_id) if j in workers]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker jobs still queued after {wait_s:g}s")
            time.sleep(1)
    log(f"cancelling the head's job {head}")
    subprocess.run(["scancel", head], check=False, timeout=60)

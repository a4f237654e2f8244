"""Slurm's autodown action (infra/node/autodown.py): the head cancels its worker jobs, then its own.

Runs inside the head's job on a compute node (the batch script starts the watcher beside Ray, see
templates/slurm.sbatch.j2), with the Slurm client commands of that node and nothing but the
standard library, Ray and this package (`queue.py` parses squeue as everywhere else). A job is
the cluster's if its `--comment` carries the cluster id (queue.JobRow.ours), and only the user's
own jobs are listed (`squeue --me`).

The head's job goes last: cancelling it ends this watcher too (and the head's private dir with its
marker). So before anything is cancelled, the marker ("removing", with the time) is copied to
`record` in the shared work dir next to the job's info file: the laptop reads it there once Slurm
no longer lists the cluster's jobs, and says "removed itself after N idle minutes at HH:MM".
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

from infra.node.autodown_marker import Marker
from infra.node.files import atomic_write
from infra.node.slurm import queue
from infra.node.wait import until

#: The record's name next to the job's other files in the work dir: <job name><RECORD_SUFFIX>.
RECORD_SUFFIX = ".autodown.json"
#: The watcher's files in the head's private dir (0700): its config and its marker.
CONFIG_FILE = "autodown.json"
MARKER_FILE = "autodown-marker.json"
ACTION = "infra.node.slurm.autodown:remove"


def _ours(cluster_id: str) -> list[queue.JobRow]:
    """This user's jobs carrying the cluster id in their comment; a failing squeue is retried and
    never read as "no jobs"."""
    def once() -> list[queue.JobRow]:
        done = subprocess.run(queue.argv("--me"), capture_output=True, text=True, check=False,
                              timeout=60)
        return queue.parse_result(done.stdout, done.stderr, done.returncode, "the cluster's jobs")

    return [row for row in queue.patiently(once, "listing the cluster's jobs")
            if row.ours(cluster_id)]


def _record(marker: str, record: str) -> None:
    """Copy the watcher's marker to the shared work dir, atomically (the laptop may read it)."""
    with open(marker) as handle:
        data = Marker.from_json(handle.read())
    atomic_write(record, data.to_json())


def remove(args: dict[str, Any], log: Callable[[str], None]) -> None:
    cluster_id = str(args["cluster_id"])
    head = str(args.get("head_job_id") or os.environ.get("SLURM_JOB_ID") or "")
    if not head:
        raise RuntimeError("no head job id (SLURM_JOB_ID unset and none in the config)")
    if args.get("marker") and args.get("record"):
        _record(str(args["marker"]), str(args["record"]))
    wait_s = float(args.get("wait_s") or 300)
    workers = sorted({row.base_id for row in _ours(cluster_id) if row.base_id != head})
    if workers:
        log(f"cancelling {len(workers)} worker job(s): {', '.join(workers)}")
        subprocess.run(["scancel", *workers], check=False, timeout=60)
        until(lambda: not [row for row in _ours(cluster_id) if row.base_id in workers], wait_s, 1,
              "the worker jobs to leave the queue")
    # A worker Ray's autoscaler submits after this point (min_workers) is cancelled by the head
    # job's own exit (the batch script's rf_finish), once its autoscaler is stopped.
    log(f"cancelling the head's job {head}")
    subprocess.run(["scancel", head], check=False, timeout=60)

"""This machine's side of Slurm autodown: what `status`, `up` and `teardown` make of the watcher
that runs beside the head in its job (templates/slurm.sbatch.j2, infra/autodown.py).

Two places tell: the live marker in the head's private dir on its compute node (read over SSH into
that node, through the login host, as the dashboard tunnel goes), and the record the removal
action copies into the shared work dir before it cancels anything (`<job name>.autodown.json`),
which outlives the job. Both are cached on this machine (`autodown.marker_path`), so a later
`status`, `up` or `teardown` still says "removed itself after N idle minutes at HH:MM". The record
counts as a removal only once Slurm lists no job of the cluster: a head job that ended at its time
limit, or was cancelled by hand, left no record and is reported as such.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from infra import autodown
from infra.errors import RayfleetError
from infra.providers.slurm import cluster
from infra.providers.slurm.autodown import MARKER_FILE, RECORD_SUFFIX

if TYPE_CHECKING:
    from infra.providers.base import AutodownView
    from infra.providers.slurm.remote import Runner
    from infra.providers.slurm.spec import Spec
    from infra.state import Resource, State


def cached(state: State) -> dict[str, Any] | None:
    """The marker this machine holds for the cluster, if it is this cluster's (same id)."""
    marker = autodown.read_marker(autodown.marker_path(state.cluster))
    if marker is None or marker.get("cluster_id") not in (None, state.cluster_id):
        return None
    return marker


def relevant(spec: Spec, state: State) -> bool:
    return spec.autodown is not None or cached(state) is not None


def forget(state: State) -> None:
    """A new head job: what the last one's watcher said no longer applies."""
    autodown.marker_path(state.cluster).unlink(missing_ok=True)


def _keep(state: State, text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("cluster_id") != state.cluster_id:
        return None  # never another cluster's file, even at our path
    autodown.cache_marker(state.cluster, text)
    return data


def refresh_live(runner: Runner, state: State, job: Resource) -> None:
    """Read the watcher's marker on the head's node into the cache; quietly: status must not fail
    because the node does not let us in (the cached one stands)."""
    head_ip, temp = job.attrs.get("head_ip"), job.attrs.get("temp_dir")
    if not head_ip or not temp:
        return
    try:
        result = runner.on_node(str(head_ip), f"cat {shlex.quote(f'{temp}/{MARKER_FILE}')}",
                                timeout=20)
    except RayfleetError:
        return
    if result.ok and result.stdout.strip():
        _keep(state, result.stdout)


def fetch_record(runner: Runner, spec: Spec, state: State, job: Resource) -> dict[str, Any] | None:
    """The removal record the head left in the work dir (cached when it is this cluster's)."""
    workdir = str(job.attrs.get("workdir", spec.submit.workdir))
    text = runner.run(f"cat {cluster.job_file(workdir, job.id, RECORD_SUFFIX)} 2>/dev/null",
                      timeout=30).stdout
    return _keep(state, text) if text.strip() else None


def view(spec: Spec, state: State, jobs_listed: bool) -> AutodownView | None:
    """The countdown, or the removal; "removing" while Slurm still lists jobs of the cluster."""
    marker = cached(state)
    if marker is None and spec.autodown is None:
        return None
    report: AutodownView = autodown.view(marker, spec.autodown.idle_minutes if spec.autodown
                                         else float((marker or {}).get("idle_minutes") or 0))
    if report.removed_at and jobs_listed:
        report = replace(report, removed_at=None, detail="removing the cluster now")
    return report

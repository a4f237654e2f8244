"""What belongs to a Slurm cluster, and ending it: the jobs carrying its id, their status, cancel.

Ownership: a job is this cluster's if its `--comment` carries the cluster id (queue.py). That
covers the head job recorded in state and every worker job Ray's autoscaler submitted after `up`,
which state never saw. Jobs named like ours without the id are mentioned, never touched.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable
from typing import Any

from infra.core import paths, remote_head, ui
from infra.core.autodown import view as autodown_view
from infra.core.errors import RayfleetError
from infra.core.state import Resource, State
from infra.node.files import atomic_write
from infra.node.slurm import queue
from infra.node.slurm.autodown import CONFIG_FILE, MARKER_FILE, RECORD_SUFFIX
from infra.node.slurm.queue import JobRow, QueueUnavailable
from infra.node.where import home_path
from infra.providers.base import Provider as BaseProvider
from infra.providers.base import ProviderStatus, with_autodown
from infra.providers.features import autodown_report
from infra.providers.slurm import cluster, costs
from infra.providers.slurm.records import Job
from infra.providers.slurm.remote import Runner
from infra.providers.slurm.spec import Spec

#: Facts of the info file worth keeping in state: enough to tunnel, show and verify teardown.
KEPT = ("head_node", "head_ip", "port_base", "gcs_port", "dashboard_port", "client_port",
        "node_manager_port", "object_manager_port", "nodes", "temp_dir", "ray_version",
        "python_version", "prometheus")
#: A head job with less than this left gets a warning in `status`.
_NEAR_END_S = 15 * 60


def token_dir(workdir: str, cluster_id: str) -> str:
    """Where the nodes read the cluster's Ray token: beside the jobs' files (shared with them)."""
    return home_path(f"{workdir.rstrip('/')}/keys/{cluster_id}")


def expected_id(spec: Spec, state: State, job: Resource[Job]) -> str | None:
    """The id a job recorded in state must carry; None for a job named before ids existed (its
    name, recorded by us, is then the only proof)."""
    prefix = queue.job_prefix(spec.name, state.cluster_id)
    return state.cluster_id if job.id.startswith(prefix) else None


def _wait_gone(runner: Runner, job_ids: list[str], what: str) -> None:
    def gone(step: ui.Step) -> bool | None:
        left = []
        for job_id in job_ids:
            try:
                rows = cluster.job_rows(runner, job_id)
            except QueueUnavailable as exc:
                step.detail(f"{exc}; retrying")  # unknown is not gone
                return None
            if rows:
                left.append(f"{job_id} {rows[0].state}")
        if left:
            step.detail(", ".join(left))
        return True if not left else None

    ui.wait_for(gone, what, timeout=180, interval=0.3,
                hint="slurmd may be unreachable; see `scontrol show job`")


def _scancel(runner: Runner, job_id: str) -> None:
    cluster.patiently(lambda: cluster.scancel(runner, job_id), f"cancelling job {job_id}")


def cancel(spec: Spec, runner: Runner, state: State, job: Resource[Job]) -> None:
    """scancel a recorded job, wait until it left the queue, verify its Ray answers nowhere,
    keep its output, forget it."""
    ids = [job.attrs.job_id] if job.attrs.job_id else cluster.patiently(
        lambda: cluster.find_by_name(runner, job.id, expected_id(spec, state, job)),
        "looking for the job by name")
    workdir = job.attrs.workdir or spec.submit.workdir
    for job_id in ids:
        info = cluster.read_info(runner, cluster.job_file(workdir, job.id, ".json"))
        attrs = Job.model_validate({**job.attrs.model_dump(exclude_unset=True),
                                    **(info.facts(KEPT) if info else {})})
        _scancel(runner, job_id)
        _wait_gone(runner, [job_id], f"Slurm job {job_id} to leave the queue")
        _verify_stopped(runner, job_id, attrs)
        _keep_output(spec, runner, workdir, job.id, job_id)
    state.remove(Job, job.id)


def teardown(spec: Spec, runner: Runner, state: State) -> None:
    """The head first (its autoscaler then submits nothing more), then every other job carrying
    the cluster id, until squeue lists none; then the token on the submit host."""
    for job in state.resources(Job):
        cancel(spec, runner, state, job)
    if not state.path.exists():
        return  # never up: nothing can carry its id
    workdir = spec.submit.workdir
    rounds = 0
    while True:
        rows = cluster.patiently(lambda: cluster.our_jobs(runner, state.cluster_id),
                                 "listing the cluster's jobs")
        ids = sorted({row.base_id for row in rows})
        if not ids:
            break
        rounds += 1
        if rounds > 5:
            raise cluster.SlurmError(f"jobs {', '.join(ids)} of cluster {spec.name} keep "
                                     "appearing; cancel them with scancel and run teardown again")
        with ui.step(f"cancelling {len(ids)} more job(s) of {spec.name}: {', '.join(ids)}"):
            for job_id in ids:
                _scancel(runner, job_id)
        _wait_gone(runner, ids, f"job(s) {', '.join(ids)} to leave the queue")
    prefix = queue.job_prefix(spec.name, state.cluster_id)
    base = home_path(f"{workdir.rstrip('/')}/{prefix}")
    runner.run(f"rm -f {base}*.out {base}*.json; rm -rf {token_dir(workdir, state.cluster_id)}",
               timeout=30)
    with contextlib.suppress(QueueUnavailable):
        for row in cluster.lookalikes(runner, f"rf-{spec.name}-", state.cluster_id):
            ui.info(f"job {row.job_id} ({row.name}) is named like this cluster's but does not "
                    "carry its id: left alone")
    state.clear_info()


def _verify_stopped(runner: Runner, job_id: str, attrs: Job) -> None:
    """No Ray process of the job may remain: none of its ports may answer on any node."""
    targets: list[tuple[str, int]] = []
    if attrs.head_ip and attrs.gcs_port:
        targets += [(attrs.head_ip, attrs.gcs_port)]
    # Each node's own ports (a worker may have taken another block than the head), and the head
    # by the address we know it by: Ray may report another one of the same node.
    for node in attrs.nodes or []:
        ip = attrs.head_ip if node.get("head") and attrs.head_ip else node["ip"]
        for key in ("node_manager_port", "object_manager_port"):
            if node.get(key):
                targets.append((ip, int(node[key])))
    if not targets:
        return

    def closed(step: ui.Step) -> bool | None:
        still = cluster.open_ports(runner, targets)
        if still:
            step.detail(", ".join(f"{ip}:{port}" for ip, port in still))
        return True if not still else None

    ui.wait_for(closed, f"no Ray process of job {job_id} to answer", timeout=20, interval=0.5,
                hint=f"stop them on the node with `pkill -f {attrs.temp_dir or ''}`")


def _keep_output(spec: Spec, runner: Runner, workdir: str, job_name: str, job_id: str) -> None:
    """Copy the job's output into .rayfleet/logs, then remove the job's files remotely."""
    text = cluster.read_output(runner, cluster.job_file(workdir, job_name, ".out"))
    if text:
        atomic_write(paths.home() / "logs" / spec.name / f"slurm-{job_id}.out", text)
    cluster.remove_files(runner, workdir, job_name)


def _position(row: JobRow, pending: list[str]) -> str:
    if row.state != "PENDING":
        return ""
    return f"{pending.index(row.base_id) + 1} of {len(pending)}" if row.base_id in pending else ""


def status(impl: BaseProvider[Spec, Any],
           runner_of: Callable[[], contextlib.AbstractContextManager[Runner]],
           state: State) -> ProviderStatus:
    """The head job and every worker job carrying the cluster id, from one squeue each, with the
    autodown report (infra/providers/features.py)."""
    spec = impl.spec
    recorded = state.resources(Job)
    if not recorded:
        return ProviderStatus(False, "no Slurm job; start one with `invoke up`")
    job = recorded[-1]
    with runner_of() as runner:
        ids = ([job.attrs.job_id] if job.attrs.job_id else
               cluster.patiently(lambda: cluster.find_by_name(
                   runner, job.id, expected_id(spec, state, job)), "looking for the job"))
        job_id = ids[0] if ids else job.id
        rows = cluster.patiently(lambda: cluster.job_rows(runner, job_id),
                                 f"reading job {job_id}") if ids else None
        others = cluster.patiently(lambda: cluster.our_jobs(runner, state.cluster_id),
                                   "listing the cluster's jobs")
        pending = cluster.patiently(lambda: cluster.pending_queue(runner),
                                    "reading the pending queue")
    # The head's marker: live while its job runs, the record it left once nothing is listed.
    listed = bool(rows or others)
    report = autodown_report(impl, state, fetch=not listed or bool(rows and rows[0].state ==
                                                                  "RUNNING"), left=listed)
    if not rows:
        if report is not None and report.removed_at:
            return with_autodown(ProviderStatus(False, ""), report,
                                 "no job of the cluster is in the queue")
        # Ended otherwise (time limit, scancel by hand): no countdown to show.
        return ProviderStatus(False, f"Slurm job {job_id} is no longer in the queue",
                              warnings=[f"job {job_id} ended; `invoke teardown` verifies "
                                        "and forgets it, `invoke up` starts a new one"])
    first = rows[0]
    ready = first.state == "RUNNING" and bool(state.info.dashboard_url)
    summary = (f"Slurm job {job_id} {first.state} on {first.nodes or '(none yet)'}, "
               f"{first.elapsed} of {first.limit}")
    if first.state == "PENDING":
        summary += f" ({first.reason})"
    workers = [r for r in others if r.base_id != job_id]
    if spec.autoscaling:
        running = sum(1 for r in workers if r.state == "RUNNING")
        waiting = sum(1 for r in workers if r.state == "PENDING")
        summary += f"; autoscaled workers: {running} running, {waiting} pending"
    table = _table([*rows, *workers], job_id, pending)
    warnings = []
    left = first.seconds_left
    if first.state == "RUNNING" and left is not None and left < _NEAR_END_S:
        warnings.append(f"the head's job {job_id} ends in {left // 60} min {left % 60} s "
                        "(its time limit): the cluster stops then")
    node_hours = costs.cost([(r.state, r.nodes, r.elapsed) for r in [*rows, *workers]])
    return ProviderStatus(ready, summary, table, warnings, state=first.state, cost=node_hours,
                          autodown=report)



def _table(rows: list[JobRow], head_id: str, pending: list[str]) -> list[dict[str, str]]:
    """`status`'s table: one row per job of the cluster, the head's first."""
    table = []
    for r in rows:
        tags = r.tags
        role = tags.get(queue.ROLE, "head") if r.base_id != head_id else "head"
        table.append({
            "job": r.job_id, "role": role + (f" ({tags[queue.NODE_TYPE]})"
                                             if tags.get(queue.NODE_TYPE) else ""),
            "state": r.state, "partition": r.partition, "nodes": r.nodes,
            "elapsed": r.elapsed, "limit": r.limit,
            "reason": "" if r.reason == "None" else r.reason,
            "queue position": _position(r, pending)})
    return table


# --- the watcher's marker: beside the head in its job (templates/slurm.sbatch.j2) ----------


def live_marker(runner: Runner, job: Resource[Job]) -> str | None:
    """The watcher's marker on the head's node, with whether the watcher (or its supervisor)
    runs; quietly None when the node does not let us in."""
    head_ip, temp = job.attrs.head_ip, job.attrs.temp_dir
    if not head_ip or not temp:
        return None
    folder = shlex.quote(str(temp))
    # The batch script records the Python that runs the head's daemons (python-path) and the
    # node package they import (node-zip-path: the script's own copy, outside the head's dir).
    status = (f'PYTHONPATH="$(cat {folder}/node-zip-path)" '
              f'"$(cat {folder}/python-path)" -m infra.node.supervise status --pidfile '
              f"{shlex.quote(f'{temp}/{CONFIG_FILE}.pid')}")
    command = remote_head.with_status_command(f"cat {shlex.quote(f'{temp}/{MARKER_FILE}')}",
                                              status)
    try:
        result = runner.node(str(head_ip)).run(command, timeout=20)
    except RayfleetError:
        return None
    return autodown_view.with_watcher_status(*remote_head.split_status(result.stdout))


def autodown_record(runner: Runner, spec: Spec, job: Resource[Job]) -> str | None:
    """The removal record the head left in the work dir, if any."""
    workdir = job.attrs.workdir or spec.submit.workdir
    text = runner.run(f"cat {cluster.job_file(workdir, job.id, RECORD_SUFFIX)} 2>/dev/null",
                      timeout=30).stdout
    return text if text.strip() else None

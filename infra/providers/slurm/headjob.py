"""The head's Slurm job, from `sbatch` to a Ray that is ready: its secrets written through
sbatch's stdin, the job recorded in state before it is submitted, a queued or running job of an
earlier `up` reused, and the queue and the job's info file followed until every node joined."""

from __future__ import annotations

import getpass
import secrets
import time
from typing import Any

from infra.core import auth, ui, versions
from infra.core.autodown import view as autodown_view
from infra.core.state import Resource, State
from infra.core.tracking import client as tracking
from infra.node.slurm import queue
from infra.node.slurm.info import Info
from infra.node.slurm.queue import QueueUnavailable, SlurmError
from infra.providers.slurm import cluster, ours
from infra.providers.slurm.records import Job
from infra.providers.slurm.remote import Runner
from infra.providers.slurm.script import tracking_store
from infra.providers.slurm.spec import Spec

#: The head job's batch script, by its name in the plan's files.
SCRIPT = "ray.sbatch"


def on_submit_host(spec: Spec, path: str) -> str:
    """`path` on the host jobs are submitted on, for messages: the path alone when that is
    this machine, else user@host:path."""
    submit = spec.submit
    return path if submit.is_local else f"{submit.user or getpass.getuser()}@{submit.host}:{path}"


def tail(spec: Spec, runner: Runner, job: Resource[Job], lines: int = 3) -> str:
    """The job output's last non-empty lines, for a message."""
    workdir = job.attrs.workdir or spec.submit.workdir
    out = cluster.read_output(runner, cluster.job_file(workdir, job.id, ".out"))
    last = [line for line in out.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(last) if last else "no output yet"


def node_secrets(spec: Spec, state: State) -> tuple[str, dict[str, str]]:
    """Where the nodes read the cluster's secrets (the submit dir's keys/<cluster id>/, a 0700
    dir of 0600 files) and their content, which `sbatch` writes there through stdin in the
    same round trip: never on a command line, never in the batch script. The Ray token (spec:
    auth), the MLflow server's password and Flask secret (spec: tracking)."""
    content: dict[str, str] = {}
    path = auth.ensure_token(state, enabled=spec.auth == "token")
    if path is not None:
        content[auth.TOKEN_FILE] = path.read_text()
    if spec.tracking == "mlflow":
        password = tracking.ensure_credentials(spec.name)
        for secret in (password, password.with_name(tracking.SECRET_KEY_FILE)):
            content[secret.name] = secret.read_text()
    return ours.token_dir(spec.submit.workdir, state.cluster_id), content


def resume(spec: Spec, runner: Runner, state: State, job: Resource[Job]) -> Info | None:
    """Reuse the job in state if it is still queued or running; forget it otherwise."""
    job_id = job.attrs.job_id
    ids = [job_id] if job_id else cluster.patiently(
        lambda: cluster.find_by_name(runner, job.id, ours.expected_id(spec, state, job)),
        "looking for the job by name")
    rows = cluster.patiently(lambda: cluster.job_rows(runner, ids[0]),
                             f"reading job {ids[0]}") if ids else None
    if rows and rows[0].state in ("PENDING", "CONFIGURING", "RUNNING"):
        if not job_id:
            job = state.update(Job, job.id, job_id=ids[0])
        ui.info(f"Slurm job {ids[0]} of {spec.name!r} is {rows[0].state}; reusing it")
        return wait_ready(spec, runner, state, job)
    ui.info(f"Slurm job {job_id or job.id} has ended; submitting a new one")
    ours.cancel(spec, runner, state, job)
    return None


def submit(spec: Spec, runner: Runner, state: State, script: str,
           keys: tuple[str, dict[str, str]]) -> Resource[Job]:
    """`sbatch` the head's job, recorded in state under its unique name first."""
    job_name = f"{queue.job_prefix(spec.name, state.cluster_id)}h{secrets.token_hex(3)}"
    # Recorded before sbatch: if we die before reading the id, teardown finds it by name.
    state.add(job_name, Job(submitted_on=runner.where, workdir=spec.submit.workdir,
                            submitted_at=time.time()))
    autodown_view.forget(state.cluster)  # a new head, a new watcher: the last one's word is void
    comment = queue.comment(state.cluster_id, state.owner, spec.name, "head")
    with ui.step(f"submitting {SCRIPT} on {runner.where}") as step:
        job_id = cluster.sbatch(runner, spec.submit.workdir, job_name, script, comment,
                                export={"RF_CLUSTER_ID": state.cluster_id,
                                        "RF_OWNER": state.owner}, secrets=keys)
        step.detail(f"job {job_id}")
    return state.update(Job, job_name, job_id=job_id)


def wait_ready(spec: Spec, runner: Runner, state: State, job: Resource[Job]) -> Info:
    """Follow the queue and the job's info file until Ray is ready on every node."""
    job_id = str(job.attrs.job_id)
    info_file = cluster.job_file(str(job.attrs.workdir), job.id, ".json")
    seen: dict[str, Any] = {}
    last_state = ["PENDING"]

    def check(step: ui.Step) -> Info | None:
        try:
            polled = cluster.poll(runner, job_id, info_file, spec.partition,
                                  position=last_state[0] == "PENDING")
        except QueueUnavailable as exc:
            # The job's fate is unknown, not "ended": wait on (queue_timeout_s bounds it).
            step.detail(f"job {job_id}: {exc}; retrying")
            return None
        info = polled.info
        message = info.message if info else ""
        if info is not None and info.head_ip and not seen:
            seen.update(info.to_dict())  # head and ports known: record them for a teardown
            state.update(Job, job.id, **info.facts(ours.KEPT))  # that verifies
        if polled.rows is None or polled.rows[0].state not in queue.LIVE_STATES - {
                "COMPLETING"}:
            last = polled.rows[0].state if polled.rows else "left the queue"
            raise SlurmError(f"Slurm job {job_id} ended ({last}) before Ray was ready: "
                             f"{message or tail(spec, runner, job)}", job_id)
        row = polled.rows[0]
        last_state[0] = row.state
        if row.state == "PENDING":
            reason = f" ({row.reason})" if row.reason not in ("None", "") else ""
            step.detail(f"job {job_id} PENDING{reason}"
                        f"{_ordinal_position(job_id, polled.pending)}")
            return None
        if info is not None and info.phase == "failed":
            raise SlurmError(f"Slurm job {job_id}: {info.message} "
                             f"({tail(spec, runner, job)})", job_id)
        if info is not None and info.phase == "ready":
            return info
        step.detail(f"job {job_id} {row.state} on {row.nodes}: "
                    f"{message or 'starting'}")
        return None

    info = ui.wait_for(
        check, f"Slurm job {job_id} to start and all Ray nodes to join",
        timeout=spec.queue_timeout_s + spec.ready_timeout_s,
        # Each poll is a round trip (squeue + the info file) that costs the login host and
        # slurmctld CPU; the job's own readiness does not wait for it.
        interval=0.5,
        hint="raise queue_timeout_s or ready_timeout_s in the spec if that is normal here")
    state.update(Job, job.id, **info.facts(ours.KEPT))
    if info.ray_version:
        for mismatch in versions.mismatches(info.facts(("ray_version", "python_version"))):
            ui.warn(f"the nodes run {mismatch}; jobs may fail to (de)serialise. Set "
                    "environment.activate (and install: true) to pin them")
    state.set_info(address=info.address, dashboard_url=info.dashboard_url,
                   job_id=job_id, head_node=info.head_node)
    if spec.tracking == "mlflow":  # what teardown says it keeps
        state.set_info(tracking_store=on_submit_host(
            spec, tracking_store(spec.submit.workdir, spec.name)))
    return info


def _ordinal_position(job_id: str, pending: list[str]) -> str:
    ids = [p.split("+")[0].split("_")[0] for p in pending]
    if job_id not in ids:
        return ""
    return f", {ids.index(job_id) + 1} of {len(ids)} pending"

"""The `slurm` provider: a Ray cluster as one sbatch job on an HPC cluster.

The batch script (templates/slurm.sbatch.j2) starts the head on the first node and a worker on
every other node, waits until all are alive, and writes the head's address and ports to an info
file next to the job's output. This side submits it (on this machine or on a login host over SSH),
follows the queue and that file, tunnels to the dashboard, and cancels the job. A job is recorded
in state under a unique job name before `sbatch` runs, so even a crash between submission and
reading the job id leaves something `teardown` can find.

Package layout: spec.py (the spec section), script.py (template variables), node_helper.py (what
runs on the nodes), remote.py (local or SSH command runner), cluster.py (Slurm commands, parsed).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

from infra import jobs, paths, ui, versions
from infra.errors import ClusterNotRunningError
from infra.providers.base import Endpoint, Plan, PlannedResource, ProviderStatus, UpOptions
from infra.providers.base import Provider as BaseProvider
from infra.providers.slurm import cluster, install, remote
from infra.providers.slurm.remote import Runner, SlurmError
from infra.providers.slurm.script import render_script
from infra.providers.slurm.spec import Spec
from infra.state import Resource, State

__all__ = ["Provider", "SlurmError", "Spec"]

JOB = "slurm-job"
SCRIPT = "ray.sbatch"
# Facts of the info file worth keeping in state: enough to tunnel, show and verify teardown.
_KEPT = ("head_node", "head_ip", "port_base", "gcs_port", "dashboard_port", "client_port",
         "node_manager_port", "object_manager_port", "nodes", "temp_dir", "ray_version",
         "python_version")



def _ordinal_position(job_id: str, pending: list[str]) -> str:
    ids = [p.split("+")[0].split("_")[0] for p in pending]
    if job_id not in ids:
        return ""
    return f", {ids.index(job_id) + 1} of {len(ids)} pending"


class Provider(BaseProvider[Spec]):
    name = "slurm"

    def __init__(self, spec: Spec) -> None:
        super().__init__(spec)
        self._open_runner: Runner | None = None

    # --- helpers -------------------------------------------------------------------------------

    def _runner(self) -> contextlib.AbstractContextManager[Runner]:
        """The runner for Slurm commands, opened once per provider object: `invoke up` plans and
        then polls through the same SSH connection (it closes with the process)."""
        if self._open_runner is None:
            self._open_runner = remote.make_runner(self.spec.submit)
        return contextlib.nullcontext(self._open_runner)

    def _job(self, state: State) -> Resource | None:
        jobs = state.resources(JOB)
        return jobs[-1] if jobs else None

    def _summary(self) -> str:
        spec = self.spec
        text = (f"{spec.nodes} node{'s' * (spec.nodes > 1)} x {spec.cpus_per_node} CPUs"
                + (f" + {spec.gpus_per_node} GPUs" if spec.gpus_per_node else ""))
        if spec.gpu_workers:
            g = spec.gpu_workers
            text += (f", GPU workers: {g.nodes} x {g.cpus_per_node} CPUs + {g.gpus_per_node} "
                     f"GPUs" + (f" ({g.partition})" if g.partition else ""))
        return (f"{text}; partition {spec.partition or '(default)'}, time limit "
                f"{spec.time_limit}, submitted on {remote.describe(spec.submit)}")

    def _tail(self, runner: Runner, job: Resource, lines: int = 3) -> str:
        workdir = str(job.attrs.get("workdir", self.spec.submit.workdir))
        out = cluster.read_output(runner, cluster.job_file(workdir, job.id, ".out"))
        tail = [line for line in out.strip().splitlines() if line.strip()][-lines:]
        return " | ".join(tail) if tail else "no output yet"

    # --- plan ----------------------------------------------------------------------------------

    def plan(self, state: State | None) -> Plan:
        script = render_script(self.spec)
        with self._runner() as runner:
            found = cluster.partitions(runner)
            notes = cluster.check_spec(self.spec, found, runner.where)
        job = self._job(state) if state else None
        name = job.id if job else f"rf-{self.spec.name}-<token>"
        detail = self._summary() + (f", job {job.attrs.get('job_id')}" if job else "")
        if self.spec.environment.install:
            notes.append(f"before submitting: {install.command(self.spec)} (on "
                         f"{remote.describe(self.spec.submit)}; idempotent)")
        notes += [
            "Ray ports: a block of 116 from "
            f"{self.spec.port_range_start} picked by the job id; temp dirs "
            f"{self.spec.ray_temp_root.rstrip('/')}/rf-<Slurm cluster>-<job id>.<node>",
            f"info file and job output in {self.spec.submit.workdir} on "
            f"{remote.describe(self.spec.submit)} (must be shared with the compute nodes)",
        ]
        return Plan(resources=[PlannedResource("Slurm job (sbatch)", name, detail, bool(job))],
                    files={SCRIPT: script}, notes=notes)

    # --- up ------------------------------------------------------------------------------------

    def up(self, state: State, plan: Plan, options: UpOptions) -> Endpoint:
        with self._runner() as runner:
            info = None
            job = self._job(state)
            if job is not None:
                info = self._resume(runner, state, job)
            if info is None:
                if self.spec.environment.install:
                    install.install(runner, self.spec)
                job = self._submit(runner, state, plan.files[SCRIPT])
                try:
                    info = self._wait_ready(runner, state, job)
                except KeyboardInterrupt:
                    ui.info(f"Slurm job {job.attrs['job_id']} stays; `invoke up` waits for it "
                            "again, `invoke teardown` cancels it")
                    raise
                except BaseException:
                    if options.keep_partial:
                        ui.info(f"keeping Slurm job {job.attrs['job_id']} (--keep-partial); "
                                "`invoke teardown` cancels it")
                        raise
                    ui.info(f"cancelling Slurm job {job.attrs['job_id']} (--keep-partial keeps "
                            "it for debugging)")
                    self._cancel(runner, state, state.find(JOB, job.id) or job)
                    raise
        endpoint = Endpoint(info["dashboard_url"], info["address"])
        with self.connect(state) as reachable:
            ui.wait_for(lambda _: True if jobs.dashboard_ready(reachable.dashboard_url) else None,
                        "the dashboard to accept jobs", timeout=self.spec.ready_timeout_s)
        if not self.spec.submit.is_local:
            target = remote.ssh_target(self.spec.submit)
            jump = f"-J {self.spec.submit.jump_host} " if self.spec.submit.jump_host else ""
            ui.info(f"the dashboard listens on the head node only; `invoke dashboard` tunnels to "
                    f"it through {target}, or by hand: ssh {jump}-L 8265:{info['head_ip']}:"
                    f"{info['dashboard_port']} {target.user}@{target.host}")
        return endpoint

    def _resume(self, runner: Runner, state: State, job: Resource) -> dict[str, Any] | None:
        """Reuse the job in state if it is still queued or running; forget it otherwise."""
        job_id = job.attrs.get("job_id")
        ids = [job_id] if job_id else cluster.find_by_name(runner, job.id)
        rows = cluster.job_rows(runner, ids[0]) if ids else None
        if rows and rows[0].state in ("PENDING", "CONFIGURING", "RUNNING"):
            if not job_id:
                job = state.update(JOB, job.id, job_id=ids[0])
            ui.info(f"Slurm job {ids[0]} of {self.spec.name!r} is {rows[0].state}; reusing it")
            return self._wait_ready(runner, state, job)
        ui.info(f"Slurm job {job_id or job.id} has ended; submitting a new one")
        self._cancel(runner, state, job)
        return None

    def _submit(self, runner: Runner, state: State, script: str) -> Resource:
        job_name = f"rf-{self.spec.name}-{secrets.token_hex(3)}"
        # Recorded before sbatch: if we die before reading the id, teardown finds it by name.
        state.add(JOB, job_name, submitted_on=runner.where, workdir=self.spec.submit.workdir,
                  submitted_at=time.time())
        with ui.step(f"submitting {SCRIPT} on {runner.where}") as step:
            job_id = cluster.sbatch(runner, self.spec.submit.workdir, job_name, script)
            step.detail(f"job {job_id}")
        return state.update(JOB, job_name, job_id=job_id)

    def _wait_ready(self, runner: Runner, state: State, job: Resource) -> dict[str, Any]:
        job_id = str(job.attrs["job_id"])
        info_file = cluster.job_file(str(job.attrs["workdir"]), job.id, ".json")
        seen: dict[str, Any] = {}

        def check(step: ui.Step) -> dict[str, Any] | None:
            polled = cluster.poll(runner, job_id, info_file, self.spec.partition)
            info = polled.info or {}
            if info.get("head_ip") and not seen:
                seen.update(info)  # head and ports known: record them for a teardown that verifies
                state.update(JOB, job.id, **{k: info[k] for k in _KEPT if k in info})
            if polled.rows is None or polled.rows[0].state not in cluster.LIVE_STATES - {
                    "COMPLETING"}:
                last = polled.rows[0].state if polled.rows else "left the queue"
                raise SlurmError(f"Slurm job {job_id} ended ({last}) before Ray was ready: "
                                 f"{info.get('message') or self._tail(runner, job)}", job_id)
            row = polled.rows[0]
            if row.state == "PENDING":
                reason = f" ({row.reason})" if row.reason not in ("None", "") else ""
                step.detail(f"job {job_id} PENDING{reason}"
                            f"{_ordinal_position(job_id, polled.pending)}")
                return None
            if info.get("phase") == "failed":
                raise SlurmError(f"Slurm job {job_id}: {info.get('message')} "
                                 f"({self._tail(runner, job)})", job_id)
            if info.get("phase") == "ready":
                return info
            step.detail(f"job {job_id} {row.state} on {row.nodes}: "
                        f"{info.get('message') or 'starting'}")
            return None

        info = ui.wait_for(
            check, f"Slurm job {job_id} to start and all Ray nodes to join",
            timeout=self.spec.queue_timeout_s + self.spec.ready_timeout_s,
            hint="raise queue_timeout_s or ready_timeout_s in the spec if that is normal here")
        state.update(JOB, job.id, **{k: info[k] for k in _KEPT if k in info})
        if info.get("ray_version"):
            for mismatch in versions.mismatches(info):
                ui.warn(f"the nodes run {mismatch}; jobs may fail to (de)serialise. Set "
                        "environment.activate (and install: true) to pin them")
        state.set_info(address=info["address"], dashboard_url=info["dashboard_url"],
                       job_id=job_id, head_node=info["head_node"])
        return info

    # --- status and connect --------------------------------------------------------------------

    def status(self, state: State) -> ProviderStatus:
        job = self._job(state)
        if job is None:
            return ProviderStatus(False, "no Slurm job; start one with `invoke up`")
        with self._runner() as runner:
            ids = ([str(job.attrs["job_id"])] if job.attrs.get("job_id")
                   else cluster.find_by_name(runner, job.id))
            job_id = ids[0] if ids else job.id
            rows = cluster.job_rows(runner, job_id) if ids else None
        if not rows:
            return ProviderStatus(False, f"Slurm job {job_id} is no longer in the queue",
                                  warnings=[f"job {job_id} ended; `invoke teardown` verifies "
                                            "and forgets it, `invoke up` starts a new one"])
        first = rows[0]
        ready = first.state == "RUNNING" and bool(state.info.get("dashboard_url"))
        summary = (f"Slurm job {job_id} {first.state} on {first.nodes or '(none yet)'}, "
                   f"{first.elapsed} of {first.limit}")
        if first.state == "PENDING":
            summary += f" ({first.reason})"
        table = [{"job": r.job_id, "state": r.state, "partition": r.partition,
                  "nodes": r.nodes, "elapsed": r.elapsed, "limit": r.limit,
                  "reason": "" if r.reason == "None" else r.reason} for r in rows]
        return ProviderStatus(ready, summary, table)

    @contextlib.contextmanager
    def connect(self, state: State) -> Iterator[Endpoint]:
        job = self._job(state)
        head_ip, port = (job.attrs.get("head_ip"), job.attrs.get("dashboard_port")) if job else (
            None, None)
        if job is None or not head_ip or not port or not state.info.get("dashboard_url"):
            raise ClusterNotRunningError(
                f"Slurm cluster {self.spec.name!r} is not running; start it with `invoke up`")
        with self._runner() as runner:
            rows = cluster.job_rows(runner, str(job.attrs["job_id"]))
            if not rows or rows[0].state != "RUNNING":
                raise ClusterNotRunningError(
                    f"Slurm job {job.attrs['job_id']} is "
                    f"{rows[0].state if rows else 'no longer in the queue'}; "
                    "`invoke teardown`, then `invoke up` for a new cluster")
            with runner.tunnel(str(head_ip), int(port)) as url:
                yield Endpoint(url, f"{head_ip}:{job.attrs['gcs_port']}",
                               tunneled=not url.startswith(f"http://{head_ip}:"))

    # --- teardown ------------------------------------------------------------------------------

    def teardown(self, state: State) -> None:
        jobs = state.resources(JOB)
        if not jobs:
            return
        with self._runner() as runner:
            for job in jobs:
                self._cancel(runner, state, job)
        state.clear_info()

    def _cancel(self, runner: Runner, state: State, job: Resource) -> None:
        """scancel, wait until the job left the queue, verify its Ray answers nowhere, forget it."""
        ids = [str(job.attrs["job_id"])] if job.attrs.get("job_id") else cluster.find_by_name(
            runner, job.id)
        workdir = str(job.attrs.get("workdir", self.spec.submit.workdir))
        for job_id in ids:
            info = cluster.read_info(runner, cluster.job_file(workdir, job.id, ".json"))
            attrs = {**job.attrs, **{k: v for k, v in (info or {}).items() if k in _KEPT}}
            cluster.scancel(runner, job_id)

            def gone(step: ui.Step, job_id: str = job_id) -> bool | None:
                rows = cluster.job_rows(runner, job_id)
                if rows:
                    step.detail(rows[0].state)
                return True if rows is None else None

            ui.wait_for(gone, f"Slurm job {job_id} to leave the queue", timeout=180,
                        interval=0.3, hint="slurmd may be unreachable; see `scontrol show job`")
            self._verify_stopped(runner, job_id, attrs)
            self._keep_output(runner, workdir, job.id, job_id)
        state.remove(JOB, job.id)

    def _verify_stopped(self, runner: Runner, job_id: str, attrs: dict[str, Any]) -> None:
        """No Ray process of the job may remain: none of its ports may answer on any node."""
        targets: list[tuple[str, int]] = []
        if attrs.get("head_ip") and attrs.get("gcs_port"):
            targets += [(attrs["head_ip"], int(attrs["gcs_port"])),
                        (attrs["head_ip"], int(attrs["dashboard_port"]))]
        # The head by the address we know it by: Ray may report another one of the same node.
        ips = {n["ip"] for n in attrs.get("nodes", []) if not n.get("head")} | (
            {attrs["head_ip"]} if attrs.get("head_ip") else set())
        for ip in sorted(ips):
            if attrs.get("node_manager_port"):
                targets += [(ip, int(attrs["node_manager_port"])),
                            (ip, int(attrs["object_manager_port"]))]
        if not targets:
            return

        def closed(step: ui.Step) -> bool | None:
            still = cluster.open_ports(runner, targets)
            if still:
                step.detail(", ".join(f"{ip}:{port}" for ip, port in still))
            return True if not still else None

        ui.wait_for(closed, f"no Ray process of job {job_id} to answer", timeout=20, interval=0.5,
                    hint=f"stop them on the node with `pkill -f {attrs.get('temp_dir', '')}`")

    def _keep_output(self, runner: Runner, workdir: str, job_name: str, job_id: str) -> None:
        """Copy the job's output into .rayfleet/logs, then remove the job's files remotely."""
        text = cluster.read_output(runner, cluster.job_file(workdir, job_name, ".out"))
        if text:
            folder = paths.home() / "logs" / self.spec.name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"slurm-{job_id}.out").write_text(text)
        cluster.remove_files(runner, workdir, job_name)

"""The Slurm provider's verbs: plan, up, status, connect, teardown.

The head job's batch script (templates/slurm.sbatch.j2) starts the head on the first node and
(fixed clusters) a worker on every other node, or (autoscaling clusters) Ray's autoscaler with our
node provider; it writes the head's address and ports to an info file next to the job's output.
This side submits it (on this machine or on a login host over SSH), follows the queue and that
file, tunnels to the dashboard on the head's loopback, and cancels every job carrying the
cluster's id. A job is recorded in state under its unique name before `sbatch` runs, so even a
crash between submission and reading the job id leaves something `teardown` can find.
"""

from __future__ import annotations

import contextlib
import getpass
import secrets
import shlex
import time
from collections.abc import Iterator
from typing import Any

from infra.core import auth, jobs, remote_head, ui, versions
from infra.core.autodown import view as autodown_view
from infra.core.errors import ClusterNotRunningError, RayfleetError
from infra.core.head import HeadAccess, SharedFsHead
from infra.core.metrics import prometheus as metrics
from infra.core.state import Resource, State
from infra.core.tracking import client as tracking
from infra.node import identity, rayproc
from infra.node.slurm import queue
from infra.node.slurm.info import Info
from infra.node.slurm.queue import QueueUnavailable, SlurmError
from infra.providers.base import (
    CostRange,
    Endpoint,
    Plan,
    PlannedResource,
    ProviderStatus,
    Readiness,
)
from infra.providers.base import Provider as BaseProvider
from infra.providers.features import HeadServices
from infra.providers.slurm import cluster, install, ours, remote
from infra.providers.slurm.records import Job
from infra.providers.slurm.remote import Runner
from infra.providers.slurm.script import (
    autoscaling_config,
    metrics_store,
    render_script,
    render_worker_script,
    sharing_home,
    tracking_store,
)
from infra.providers.slurm.spec import Spec

__all__ = ["Provider", "SlurmError", "Spec"]

SCRIPT = "ray.sbatch"
WORKER_SCRIPT = "worker.sbatch"
AUTOSCALING = "autoscaling.yaml"
_KEPT = ours.KEPT


def _ordinal_position(job_id: str, pending: list[str]) -> str:
    ids = [p.split("+")[0].split("_")[0] for p in pending]
    if job_id not in ids:
        return ""
    return f", {ids.index(job_id) + 1} of {len(ids)} pending"


class Provider(BaseProvider[Spec, None]):
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

    def _job(self, state: State) -> Resource[Job] | None:
        found = state.resources(Job)
        return found[-1] if found else None

    def _summary(self) -> str:
        spec = self.spec
        text = (f"{spec.nodes} node{'s' * (spec.nodes > 1)} x {spec.cpus_per_node} CPUs"
                + (f" + {spec.gpus_per_node} GPUs" if spec.gpus_per_node else ""))
        if spec.gpu_workers:
            g = spec.gpu_workers
            text += (f", GPU workers: {g.nodes} x {g.cpus_per_node} CPUs + {g.gpus_per_node} "
                     f"GPUs" + (f" ({g.partition})" if g.partition else ""))
        if spec.autoscaling:
            text = "head: " + text + "; autoscaled workers: " + ", ".join(
                f"{name} {w.min_workers}-{w.max_workers} x {w.cpus_per_node} CPUs"
                + (f" + {w.gpus_per_node} GPUs" if w.gpus_per_node else "")
                for name, w in spec.worker_types.items())
        return (f"{text}; partition {spec.partition or '(default)'}, time limit "
                f"{spec.time_limit}, submitted on {remote.describe(spec.submit)}")

    def _tail(self, runner: Runner, job: Resource[Job], lines: int = 3) -> str:
        workdir = job.attrs.workdir or self.spec.submit.workdir
        out = cluster.read_output(runner, cluster.job_file(workdir, job.id, ".out"))
        tail = [line for line in out.strip().splitlines() if line.strip()][-lines:]
        return " | ".join(tail) if tail else "no output yet"

    # --- plan ----------------------------------------------------------------------------------

    def plan(self, state: State | None) -> Plan[None]:
        files = {SCRIPT: render_script(self.spec)}
        if self.spec.autoscaling:
            files[WORKER_SCRIPT] = render_worker_script(self.spec)
            files[AUTOSCALING] = autoscaling_config(self.spec)
        with self._runner() as runner:
            found = cluster.partitions(runner)
            notes = cluster.check_spec(self.spec, found, runner.where)
        job = self._job(state) if state else None
        cluster_id = state.cluster_id if state else identity.ID_PLACEHOLDER
        name = job.id if job else f"rf-{self.spec.name}-{cluster_id}-h<token>"
        detail = self._summary() + (f", job {job.attrs.job_id}" if job else "")
        resources = [PlannedResource("Slurm job (sbatch)", name, detail, bool(job))]
        for type_name, worker in self.spec.worker_types.items():
            resources.append(PlannedResource(
                "Slurm jobs (autoscaled workers)", f"rf-{self.spec.name}-{cluster_id}-w-"
                f"{type_name}-<token>", f"{worker.min_workers} to {worker.max_workers}, submitted "
                "and cancelled by Ray's autoscaler on the head"))
        if self.spec.environment.install:
            notes.append(f"before submitting: {install.command(self.spec)} (on "
                         f"{remote.describe(self.spec.submit)}; idempotent)")
        root = self.spec.ray_temp_root.rstrip("/")
        notes += [
            "Ray ports: a block of 116 from "
            f"{self.spec.port_range_start} picked by the job id, checked free on every node; "
            f"private temp dirs {root}/rf-{cluster_id}.<node>.XXXXXX (mktemp -d, 0700)",
            f"info file and job output in {self.spec.submit.workdir} on "
            f"{remote.describe(self.spec.submit)} (must be shared with the compute nodes)",
            "the dashboard listens on the head's loopback only; rayfleet reaches it through an "
            "SSH tunnel into the head's node",
        ]
        if self.spec.tracking == "mlflow":
            notes.append(
                f"MLflow tracking server in the head's job, on the head's address at port "
                f"{rayproc.PortBlock(0).tracking} of the block (MLflow's login, password in "
                f"{tracking.password_path(self.spec.name)}); store {self._tracking_store()}, kept "
                "after teardown; `invoke mlflow` tunnels to it")
        if self.spec.metrics == "prometheus":
            notes.append(
                f"Prometheus in the head's job, on the head node's loopback at port "
                f"{rayproc.PortBlock(0).prometheus} of the block (a `prometheus` on the head's "
                f"PATH, in its env, or /usr/bin; none: the cluster runs without metrics); history "
                f"in {self._metrics_store()}, kept after teardown; `invoke top`, `invoke report`")
        if self.spec.sharing is not None:
            notes.append(
                f"sharing gateway in the head's job, on all the head node's addresses at port "
                f"{self.spec.sharing.port} (members on the site reach it there, others through "
                "their own `ssh -L` via a login host; no firewall: the site's network decides "
                "who reaches it); its certificate, members' token hashes and usage in "
                f"{self._on_submit_host(sharing_home(self.spec.submit.workdir, self.spec.name))}"
                ", kept after teardown")
        return Plan(resources=resources, files=files, notes=notes, extra=None)

    # --- up ------------------------------------------------------------------------------------

    def create(self, state: State, plan: Plan[None]) -> Endpoint:
        # A failed or interrupted `up` cancels the job it submitted (the base's rollback:
        # ours.teardown also cancels any worker its autoscaler submitted, they carry the id).
        with self._runner() as runner:
            info = None
            job = self._job(state)
            if job is not None:
                info = self._resume(runner, state, job)
            if info is not None:
                return self._ready_endpoint(state, info)
            if self.spec.environment.install:
                install.install(runner, self.spec)
            job = self._submit(runner, state, plan.files[SCRIPT], self._secrets(state))
            # Everything after sbatch, up to a dashboard that answers through the tunnel.
            info = self._wait_ready(runner, state, job)
            return self._ready_endpoint(state, info)

    def _ready_endpoint(self, state: State, info: Info) -> Endpoint:
        token = auth.token_file(state)
        with self.connect(state) as reachable:
            ui.wait_for(lambda _: True if jobs.dashboard_ready(reachable.dashboard_url, token)
                        else None, "the dashboard to accept jobs (through the tunnel)",
                        timeout=self.spec.ready_timeout_s)
        if self.spec.autodown is not None:
            ui.info(f"autodown: the head's job runs an idle watcher; after "
                    f"{self.spec.autodown.idle_minutes:g} minutes without a job, task, actor or "
                    "driver it cancels the cluster's jobs, the head's last (`invoke status` "
                    "shows the countdown)")
        ui.info(f"the dashboard listens on the head node's loopback only; `invoke dashboard` "
                f"tunnels to it (SSH into {info.head_ip}"
                + ("" if self.spec.submit.is_local else
                   f" through {remote.describe(self.spec.submit)}") + ")")
        if self.spec.tracking == "mlflow":
            ui.info(f"MLflow tracking server: starting in the head's job on {info.head_ip}, "
                    f"store {self._tracking_store()} (kept after teardown); every node's jobs "
                    "find it; `invoke mlflow` opens its UI")
        self._note_metrics(state, info)
        return remote_head.announced(info.dashboard_url, info.address, token)

    def _note_metrics(self, state: State, info: Info) -> None:
        """Say where the head's Prometheus runs, or in one line that the head has none."""
        if self.spec.metrics != "prometheus":
            return
        if not info.prometheus:
            ui.warn(f"metrics: no `prometheus` on the head's node {info.head_node} (install "
                    "it with environment.install, or put it on the nodes' PATH); the cluster "
                    "runs without metrics")
            return
        port = int(info.port_base) + rayproc.PortBlock(0).prometheus
        ui.info(f"metrics: Prometheus starting in the head's job on {info.head_node}'s "
                f"loopback, port {port}, "
                f"history in {self._metrics_store()} (kept after teardown); `invoke top`, "
                "`invoke report`")
        metrics.note_started(state, self.spec.metrics_history.scrape_interval_s)

    def _metrics_store(self) -> str:
        """Where the Prometheus history is, for messages: host and path."""
        return self._on_submit_host(metrics_store(self.spec.submit.workdir, self.spec.name))

    def _secrets(self, state: State) -> tuple[str, dict[str, str]]:
        """Where the nodes read the cluster's secrets (the submit dir's keys/<cluster id>/, a 0700
        dir of 0600 files) and their content, which `sbatch` writes there through stdin in the
        same round trip: never on a command line, never in the batch script. The Ray token (spec:
        auth), the MLflow server's password and Flask secret (spec: tracking)."""
        content: dict[str, str] = {}
        path = auth.ensure_token(state, enabled=self.spec.auth == "token")
        if path is not None:
            content[auth.TOKEN_FILE] = path.read_text()
        if self.spec.tracking == "mlflow":
            password = tracking.ensure_credentials(self.spec.name)
            for secret in (password, password.with_name(tracking.SECRET_KEY_FILE)):
                content[secret.name] = secret.read_text()
        return ours.token_dir(self.spec.submit.workdir, state.cluster_id), content

    def _tracking_store(self) -> str:
        """Where the tracking store is, for messages: host and path."""
        return self._on_submit_host(tracking_store(self.spec.submit.workdir, self.spec.name))

    def _on_submit_host(self, path: str) -> str:
        submit = self.spec.submit
        return path if submit.is_local else f"{submit.user or getpass.getuser()}@{submit.host}:{path}"

    def _resume(self, runner: Runner, state: State, job: Resource[Job]) -> Info | None:
        """Reuse the job in state if it is still queued or running; forget it otherwise."""
        job_id = job.attrs.job_id
        ids = [job_id] if job_id else cluster.patiently(
            lambda: cluster.find_by_name(runner, job.id, ours.expected_id(self.spec, state,
                                                                               job)),
            "looking for the job by name")
        rows = cluster.patiently(lambda: cluster.job_rows(runner, ids[0]),
                                 f"reading job {ids[0]}") if ids else None
        if rows and rows[0].state in ("PENDING", "CONFIGURING", "RUNNING"):
            if not job_id:
                job = state.update(Job, job.id, job_id=ids[0])
            ui.info(f"Slurm job {ids[0]} of {self.spec.name!r} is {rows[0].state}; reusing it")
            return self._wait_ready(runner, state, job)
        ui.info(f"Slurm job {job_id or job.id} has ended; submitting a new one")
        ours.cancel(self.spec, runner, state, job)
        return None

    def _submit(self, runner: Runner, state: State, script: str,
                keys: tuple[str, dict[str, str]]) -> Resource[Job]:
        job_name = f"{queue.job_prefix(self.spec.name, state.cluster_id)}h{secrets.token_hex(3)}"
        # Recorded before sbatch: if we die before reading the id, teardown finds it by name.
        state.add(job_name, Job(submitted_on=runner.where, workdir=self.spec.submit.workdir,
                                submitted_at=time.time()))
        autodown_view.forget(state.cluster)  # a new head, a new watcher: the last one's word is void
        comment = queue.comment(state.cluster_id, state.owner, self.spec.name, "head")
        with ui.step(f"submitting {SCRIPT} on {runner.where}") as step:
            job_id = cluster.sbatch(runner, self.spec.submit.workdir, job_name, script, comment,
                                    export={"RF_CLUSTER_ID": state.cluster_id,
                                            "RF_OWNER": state.owner}, secrets=keys)
            step.detail(f"job {job_id}")
        return state.update(Job, job_name, job_id=job_id)

    def _wait_ready(self, runner: Runner, state: State, job: Resource[Job]) -> Info:
        job_id = str(job.attrs.job_id)
        info_file = cluster.job_file(str(job.attrs.workdir), job.id, ".json")
        seen: dict[str, Any] = {}
        last_state = ["PENDING"]

        def check(step: ui.Step) -> Info | None:
            try:
                polled = cluster.poll(runner, job_id, info_file, self.spec.partition,
                                      position=last_state[0] == "PENDING")
            except QueueUnavailable as exc:
                # The job's fate is unknown, not "ended": wait on (queue_timeout_s bounds it).
                step.detail(f"job {job_id}: {exc}; retrying")
                return None
            info = polled.info
            message = info.message if info else ""
            if info is not None and info.head_ip and not seen:
                seen.update(info.to_dict())  # head and ports known: record them for a teardown
                state.update(Job, job.id, **info.facts(_KEPT))  # that verifies
            if polled.rows is None or polled.rows[0].state not in queue.LIVE_STATES - {
                    "COMPLETING"}:
                last = polled.rows[0].state if polled.rows else "left the queue"
                raise SlurmError(f"Slurm job {job_id} ended ({last}) before Ray was ready: "
                                 f"{message or self._tail(runner, job)}", job_id)
            row = polled.rows[0]
            last_state[0] = row.state
            if row.state == "PENDING":
                reason = f" ({row.reason})" if row.reason not in ("None", "") else ""
                step.detail(f"job {job_id} PENDING{reason}"
                            f"{_ordinal_position(job_id, polled.pending)}")
                return None
            if info is not None and info.phase == "failed":
                raise SlurmError(f"Slurm job {job_id}: {info.message} "
                                 f"({self._tail(runner, job)})", job_id)
            if info is not None and info.phase == "ready":
                return info
            step.detail(f"job {job_id} {row.state} on {row.nodes}: "
                        f"{message or 'starting'}")
            return None

        info = ui.wait_for(
            check, f"Slurm job {job_id} to start and all Ray nodes to join",
            timeout=self.spec.queue_timeout_s + self.spec.ready_timeout_s,
            # Each poll is a round trip (squeue + the info file) that costs the login host and
            # slurmctld CPU; the job's own readiness does not wait for it.
            interval=0.5,
            hint="raise queue_timeout_s or ready_timeout_s in the spec if that is normal here")
        state.update(Job, job.id, **info.facts(_KEPT))
        if info.ray_version:
            for mismatch in versions.mismatches(info.facts(("ray_version", "python_version"))):
                ui.warn(f"the nodes run {mismatch}; jobs may fail to (de)serialise. Set "
                        "environment.activate (and install: true) to pin them")
        state.set_info(address=info.address, dashboard_url=info.dashboard_url,
                       job_id=job_id, head_node=info.head_node)
        if self.spec.tracking == "mlflow":  # what teardown says it keeps
            state.set_info(tracking_store=self._tracking_store())
        return info

    # --- status and connect --------------------------------------------------------------------

    def status(self, state: State) -> ProviderStatus:
        return ours.status(self, self._runner, state)

    def head_services(self, state: State) -> HeadServices | None:
        """The head's job starts its own daemons; the watcher's marker is read live on the
        head's node, or (nothing listed) from the record it left in the work dir."""
        job = self._job(state)
        if job is None:
            return None

        def marker(left: bool | None) -> str | None:
            with self._runner() as runner:
                if left is False:
                    return ours.autodown_record(runner, self.spec, job)
                return ours.live_marker(runner, job)

        return HeadServices(marker=marker)

    def listed(self, state: State) -> bool | None:
        """Whether Slurm lists any job carrying the cluster id."""
        if self._job(state) is None:
            return False
        with self._runner() as runner:
            return bool(cluster.patiently(lambda: cluster.our_jobs(runner, state.cluster_id),
                                          "listing the cluster's jobs"))

    def cost_range(self, plan: Plan[None] | None) -> CostRange | None:
        """Node-hours per hour at the smallest and largest size (Slurm bills no money): a fixed
        cluster holds all its nodes; an autoscaling one its head plus min..max workers."""
        spec = self.spec
        if spec.autoscaling:
            low = 1 + sum(w.min_workers for w in spec.worker_types.values())
            high = 1 + sum(w.max_workers for w in spec.worker_types.values())
        else:
            low = high = spec.total_nodes
        return CostRange(low, high, source="node-hours of your allocation; Slurm bills no money",
                         node_hours=True)


    def readiness(self) -> list[Readiness]:
        """Slurm's client commands and configuration where the spec runs them (this machine or
        the login host over SSH, logged into as every other command is)."""
        submit = self.spec.submit
        rows: list[Readiness] = []
        try:
            with remote.opened(submit) as runner:
                conf = submit.slurm_conf
                # Slurm retries a missing configuration file for a minute before it says so.
                missing = conf is not None and not runner.run(
                    f"test -r {shlex.quote(conf)}", timeout=20).ok
                if not submit.is_local:
                    rows.append(Readiness("login host", True, runner.where))
                if missing:
                    return [*rows, Readiness(
                        "Slurm configuration", False, f"{conf} is not readable on {runner.where}",
                        f"fix submit.slurm_conf in {self.spec.source}, or remove it for the "
                        "system's default")]
                version = runner.check("sinfo --version", timeout=20).strip()
                rows.append(Readiness("Slurm commands", True, f"{version} on {runner.where}"))
                partitions = runner.check("sinfo -h -o %P", timeout=20).split()
        except RayfleetError as exc:
            what = "Slurm commands" if rows or submit.is_local else "login host"
            return [*rows, Readiness.failed(what, exc, (
                f"check submit: in {self.spec.source}: `ssh {remote.describe(submit)}` must log in "
                "without a password" if what == "login host" else "see the message"))]
        return [*rows, Readiness("Slurm configuration", bool(partitions),
                                 f"partitions: {', '.join(partitions) or 'none'}",
                                 "" if partitions else "slurmctld lists no partition; ask your "
                                 "site's admins")]

    def _head_job(self, state: State) -> tuple[Resource[Job], str, int]:
        """The head's job, its node's address and the dashboard's port there."""
        job = self._job(state)
        head_ip, port = (job.attrs.head_ip, job.attrs.dashboard_port) if job else (None, None)
        if job is None or not head_ip or not port or not state.info.dashboard_url:
            raise ClusterNotRunningError(
                f"Slurm cluster {self.spec.name!r} is not running; start it with `invoke up`")
        return job, head_ip, port

    def head_access(self, state: State) -> HeadAccess:
        """The head's compute node: through the login host when Slurm is remote, directly when
        this machine submits, and this machine itself when the head runs here."""
        job, head_ip, port = self._head_job(state)
        client = job.attrs.client_port
        workdir = (job.attrs.workdir or self.spec.submit.workdir).rstrip("/")
        # Plain `~/` or absolute paths: HeadAccess's users quote them for the shell themselves.
        keys = f"{workdir}/keys/{state.cluster_id}"
        record: dict[str, Any] = dict(
            env=auth.head_env(state, f"{keys}/{auth.TOKEN_FILE}"),
            dashboard_port=port,
            client_port=client or None,
            # Members reach the gateway by the node's address, or through their own tunnel
            # (NOTES.md "The sharing gateway"). Not by the node's name: the cluster's CA signs
            # for no DNS name but localhost (infra/core/sharing/certs.py).
            names=("127.0.0.1", "localhost"),
            tracking_password=f"{keys}/{tracking.PASSWORD_FILE}")
        with self._runner() as runner:
            node = runner.node(head_ip, **record)
        # spec: sharing: the head's job runs the gateway from this folder on the shared work dir.
        return SharedFsHead(node=node, where=node.where,
                            private_root=sharing_home(workdir, self.spec.name), **record)

    @contextlib.contextmanager
    def connect(self, state: State) -> Iterator[Endpoint]:
        job, head_ip, port = self._head_job(state)
        with self._runner() as runner:
            rows = cluster.patiently(lambda: cluster.job_rows(runner, str(job.attrs.job_id)),
                                     "reading the head's job")
            if not rows or rows[0].state != "RUNNING":
                raise ClusterNotRunningError(
                    f"Slurm job {job.attrs.job_id} is "
                    f"{rows[0].state if rows else 'no longer in the queue'}; "
                    "`invoke teardown`, then `invoke up` for a new cluster")
            block = rayproc.PortBlock(job.attrs.port_base or
                                      port - rayproc.PortBlock(0).dashboard)
            mlflow = self.spec.tracking == "mlflow"
            # The head's job found a `prometheus` to run (older jobs did not say: none).
            measured = self.spec.metrics == "prometheus" and bool(job.attrs.prometheus)
            # One SSH connection into the head's node (through the login host if remote; none
            # when it is this machine): the dashboard and Serve's proxy on its loopback, the
            # tracking server on the head's address (where the nodes reach it), Prometheus on
            # the loopback again.
            with remote_head.endpoint(
                    runner.node_target(head_ip), f"{head_ip}:{job.attrs.gcs_port}",
                    auth.token_file(state), ("127.0.0.1", port),
                    ("127.0.0.1", block.serve_http),
                    (head_ip, block.tracking) if mlflow else None,
                    tracking.password_path(self.spec.name) if mlflow else None,
                    ("127.0.0.1", block.prometheus) if measured else None) as endpoint:
                yield endpoint

    # --- teardown ------------------------------------------------------------------------------

    def teardown(self, state: State) -> None:
        with self._runner() as runner:
            ours.teardown(self.spec, runner, state)


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
import shlex
from collections.abc import Iterator
from typing import Any

from infra.core import auth, jobs, remote_head, ui
from infra.core.errors import ClusterNotRunningError, RayfleetError
from infra.core.head import HeadAccess, SharedFsHead
from infra.core.metrics import prometheus as metrics
from infra.core.state import Resource, State
from infra.core.tracking import client as tracking
from infra.node import identity, rayproc
from infra.node.slurm.info import Info
from infra.node.slurm.queue import SlurmError
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
from infra.providers.slurm import cluster, headjob, install, ours, remote
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

SCRIPT = headjob.SCRIPT
WORKER_SCRIPT = "worker.sbatch"
AUTOSCALING = "autoscaling.yaml"


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
                info = headjob.resume(self.spec, runner, state, job)
            if info is not None:
                return self._ready_endpoint(state, info)
            if self.spec.environment.install:
                install.install(runner, self.spec)
            job = headjob.submit(self.spec, runner, state, plan.files[SCRIPT],
                                 headjob.node_secrets(self.spec, state))
            # Everything after sbatch, up to a dashboard that answers through the tunnel.
            info = headjob.wait_ready(self.spec, runner, state, job)
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

    def _tracking_store(self) -> str:
        """Where the tracking store is, for messages: host and path."""
        return self._on_submit_host(tracking_store(self.spec.submit.workdir, self.spec.name))

    def _on_submit_host(self, path: str) -> str:
        return headjob.on_submit_host(self.spec, path)

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


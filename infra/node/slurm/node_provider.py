"""Ray's autoscaler on Slurm: each worker node is one sbatch job that this provider submits and
cancels. Ray's monitor on the head imports it (`provider: {type: external, module:
infra.node.slurm.node_provider.SlurmNodeProvider}`), so it needs Ray and the standard
library only (plus queue.py, infra.core.errors, infra.node.identity, shipped with it into the head's dir).

- State comes from Slurm: one `squeue` per refresh (at most one a second), filtered by the
  cluster id in the jobs' comments. A failed squeue is retried; if it keeps failing, the last
  known state stands (never "every node is gone", which would make Ray launch duplicates).
- Node id = Slurm job id. The worker script exports it as RAY_CLOUD_INSTANCE_ID, which is how
  autoscaler v2 matches Ray nodes to our jobs (`disable_node_updaters`: no SSH, the batch
  script starts Ray itself). Tags live in the job's comment (kind, type, launch request).
- A pending job is a node that is not running yet (v2: ALLOCATED); one that no demand needs is
  terminated (= scancel) after RAY_AUTOSCALER_PENDING_NODE_IDLE_TIMEOUT_S, set on the head.
- Walltime: a worker's --time is its type's limit, cut to what the head's job has left.

Runs on the head's compute node, where Slurm's client commands work inside a job. Thread-safe:
one lock around the cache and every Slurm command (launcher threads, v2's executors and the main
loop call in concurrently). Slurm's commands run without a shell: a `bash -c` may source the
user's rc files (see NOTES.md), which stalled squeue for 30 s and more on the test bed.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    TAG_RAY_LAUNCH_REQUEST,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_NAME,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from infra.node.slurm import queue
from infra.node.slurm.queue import JobRow, QueueUnavailable, SlurmError

logger = logging.getLogger(__name__)

#: The head's node type (script.HEAD_TYPE; not imported: script.py needs jinja and pydantic).
HEAD_TYPE = "ray.head.default"
#: A worker whose job would end within this many seconds of the head's is not worth starting.
MIN_WORKER_S = 120
#: Seconds to keep listing a job sbatch accepted before squeue shows it.
LISTING_GRACE_S = 60
#: Variables of the monitor's environment that must not reach a worker job (--export=ALL). The
#: MLflow password would be kept by slurmctld with the job's environment: the worker reads it
#: from its 0600 file instead.
_NOT_INHERITED = ("RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME", "RAY_OVERRIDE_RESOURCES",
                  "RAY_OVERRIDE_LABELS", "RAY_ADDRESS", "RAY_RAYLET_PID", "RAY_JOB_ID",
                  "PYTHONPATH", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME",
                  "SSH_CLIENT", "SSH2_CLIENT", "SSH_CONNECTION", "SSH_TTY",
                  "MLFLOW_TRACKING_PASSWORD")


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} took over {timeout:.0f}s")


@dataclass(frozen=True)
class Runtime:
    """What only the running head's job knows, read from the environment the batch script gives
    the head's `ray start` (and so Ray's monitor, which imports this provider): the cluster
    config the laptop rendered stays as it was rendered."""
    cluster_id: str
    owner: str
    head_job_id: str
    head_ip: str
    gcs_port: int
    port_base: int
    submit_dir: str
    worker_script: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Runtime:
        names = ("RF_CLUSTER_ID", "RF_JOB_ID", "RF_HEAD_IP", "RF_GCS_PORT", "RF_BASE",
                 "SLURM_SUBMIT_DIR", "RF_HEAD_TEMP")
        missing = [name for name in names if not env.get(name)]
        if missing:
            raise SlurmError(f"the head's environment lacks {', '.join(missing)}: Ray's monitor "
                             "must be started by the cluster's batch script (invoke up)")
        return cls(env["RF_CLUSTER_ID"], env.get("RF_OWNER", ""), env["RF_JOB_ID"],
                   env["RF_HEAD_IP"], int(env["RF_GCS_PORT"]), int(env["RF_BASE"]),
                   env["SLURM_SUBMIT_DIR"], os.path.join(env["RF_HEAD_TEMP"], "worker.sbatch"))


class SlurmNodeProvider(NodeProvider):
    """Worker nodes as Slurm jobs of one rayfleet cluster (see the module docstring)."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self.runtime = runtime = Runtime.from_env(os.environ)
        self._cluster_id = runtime.cluster_id
        self._owner = runtime.owner
        self._cluster = str(provider_config.get("cluster", cluster_name))
        self._prefix = queue.job_prefix(self._cluster, self._cluster_id)
        self._head_job = runtime.head_job_id
        self._head_address = f"{runtime.head_ip}:{runtime.gcs_port}"
        self._port_base = runtime.port_base
        self._submit_dir = runtime.submit_dir
        self._script = runtime.worker_script
        self._types: dict[str, dict[str, Any]] = dict(provider_config.get("worker_types", {}))
        self._lock = threading.RLock()
        self._rows: dict[str, JobRow] = {}
        self._refreshed_at = 0.0
        #: job id -> (tags, time sbatch returned): listed until squeue has caught up.
        self._launched: dict[str, tuple[dict[str, str], float]] = {}
        #: Jobs we cancelled: never listed again, though squeue shows them for a while.
        self._cancelled: set[str] = set()
        self._ips: dict[str, str] = {}
        self._user = pwd.getpwuid(os.getuid()).pw_name

    # --- the queue ---------------------------------------------------------------------------

    def _squeue(self) -> list[JobRow]:
        """Our jobs, one squeue; retried for a round's patience, then QueueUnavailable."""
        def once() -> list[JobRow]:
            done = _run(queue.argv("-u", self._user), timeout=30)
            return queue.parse_result(done.stdout, done.stderr, done.returncode,
                                      "the cluster's jobs")

        rows = queue.patiently(once, "listing the cluster's jobs", queue.ROUND_PATIENCE_S)
        return [row for row in rows if row.ours(self._cluster_id)]

    def _refresh(self, max_age: float = 1.0) -> None:
        with self._lock:
            if time.monotonic() - self._refreshed_at < max_age:
                return
            started = time.time()
            try:
                rows = self._squeue()
            except QueueUnavailable as exc:
                # Unknown is not empty: keep what we knew, try again on the next call.
                logger.warning("rayfleet: %s; keeping the last known jobs", exc)
                return
            self._rows = {row.base_id: row for row in rows
                          if row.state in queue.LIVE_STATES and row.state != "COMPLETING"}
            self._refreshed_at = time.monotonic()
            for job_id, (_, submitted) in list(self._launched.items()):
                if job_id in self._rows or submitted < started - LISTING_GRACE_S:
                    del self._launched[job_id]
            self._cancelled &= {row.base_id for row in rows}

    def _tags_of(self, job_id: str) -> dict[str, str]:
        if job_id in self._launched:
            return dict(self._launched[job_id][0])
        row = self._rows.get(job_id)
        if row is None:
            return {}
        tags = row.tags
        if tags.get(queue.ROLE) == "head":
            kind, node_type = NODE_KIND_HEAD, HEAD_TYPE
        else:
            kind, node_type = NODE_KIND_WORKER, tags.get(queue.NODE_TYPE, "")
        result = {TAG_RAY_NODE_KIND: kind, TAG_RAY_USER_NODE_TYPE: node_type,
                  TAG_RAY_NODE_NAME: row.name, TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}
        if tags.get(queue.REQUEST):
            result[TAG_RAY_LAUNCH_REQUEST] = tags[queue.REQUEST]
        return result

    # --- NodeProvider --------------------------------------------------------------------------

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        with self._lock:
            self._refresh()
            ids = (set(self._rows) | set(self._launched)) - self._cancelled
            return sorted(i for i in ids
                          if all(self._tags_of(i).get(k) == v for k, v in tag_filters.items()))

    def is_running(self, node_id: str) -> bool:
        with self._lock:
            row = self._rows.get(node_id)
            return row is not None and row.state == "RUNNING"

    def is_terminated(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._cancelled or (
                node_id not in self._rows and node_id not in self._launched)

    def node_tags(self, node_id: str) -> dict[str, str]:
        with self._lock:
            return self._tags_of(node_id)

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        # Without node updaters Ray only sets the status tag, which we derive from the queue.
        return None

    # Ray's contract says None while a node boots, though its annotation says str.
    def internal_ip(self, node_id: str) -> str | None:  # type: ignore[override]
        with self._lock:
            if node_id == self._head_job:
                return self._head_address.rsplit(":", 1)[0]
            row = self._rows.get(node_id)
            if row is None or row.state != "RUNNING" or not row.nodes:
                return None
            if row.nodes not in self._ips:
                try:
                    self._ips[row.nodes] = socket.gethostbyname(row.nodes)
                except OSError:
                    return None
            return self._ips[row.nodes]

    def external_ip(self, node_id: str) -> str | None:  # type: ignore[override]
        return self.internal_ip(node_id)

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, Any]:
        return self.create_node_with_resources_and_labels(node_config, tags, count, {}, {})

    def create_node_with_resources_and_labels(
            self, node_config: dict[str, Any], tags: dict[str, str], count: int,
            resources: dict[str, float], labels: dict[str, str]) -> dict[str, Any]:
        node_type = tags.get(TAG_RAY_USER_NODE_TYPE) or str(node_config.get("worker_type", ""))
        if node_type not in self._types:
            raise SlurmError(f"unknown worker type {node_type!r}; known: {sorted(self._types)}")
        created = {}
        for _ in range(count):
            job_id = self._submit(node_type, tags, resources, labels)
            created[job_id] = {"job_id": job_id, "type": node_type}
        return created

    def _head_seconds_left(self) -> int | None:
        self._refresh(max_age=5.0)
        row = self._rows.get(self._head_job)
        return row.seconds_left if row else None

    def _submit(self, node_type: str, tags: dict[str, str], resources: dict[str, float],
                labels: dict[str, str]) -> str:
        with self._lock:
            settings = self._types[node_type]
            limit = int(settings["time_limit_s"])
            left = self._head_seconds_left()
            if left is not None:
                if left - 60 < MIN_WORKER_S:
                    raise SlurmError(f"the head's job {self._head_job} ends in {left}s: "
                                     "no new workers")
                limit = min(limit, left - 60)
            request = tags.get(TAG_RAY_LAUNCH_REQUEST, "")
            name = f"{self._prefix}w-{node_type}-{secrets.token_hex(3)}"
            comment = queue.comment(self._cluster_id, self._owner, self._cluster, "worker",
                                    **{queue.NODE_TYPE: node_type, queue.REQUEST: request})
            cpus = int(resources.get("CPU", 1))
            gpus = int(resources.get("GPU", 0))
            head_ip, gcs_port = self._head_address.rsplit(":", 1)
            env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
            env.update({
                "RF_CLUSTER_ID": self._cluster_id, "RF_NODE_TYPE": node_type,
                "RF_HEAD_IP": head_ip, "RF_GCS_PORT": gcs_port, "RF_BASE": str(self._port_base),
                "RF_RESOURCES": json.dumps(resources), "RF_LABELS": json.dumps(labels),
                "RF_CPUS": str(cpus), "RF_GPUS": str(gpus),
                "RF_OBJECT_STORE": str(settings.get("object_store") or ""),
            })
            argv = ["sbatch", "--parsable", f"--job-name={name}", f"--comment={comment}",
                    "--output=%x.out", f"--time={queue.slurm_time(limit)}",
                    "--export=ALL", *settings["sbatch"], self._script]
            done = _run(argv, env=env, cwd=self._submit_dir)
            job_id = done.stdout.strip().split(";")[0]
            if done.returncode != 0 or not job_id.isdigit():
                last = (done.stderr.strip().splitlines() or [done.stdout.strip() or "no output"])
                raise SlurmError(f"sbatch for a {node_type} worker failed: {last[-1]}")
            worker_tags = {TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_USER_NODE_TYPE: node_type,
                           TAG_RAY_NODE_NAME: name, TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}
            if request:
                worker_tags[TAG_RAY_LAUNCH_REQUEST] = request
            self._launched[job_id] = (worker_tags, time.time())
            logger.info("rayfleet: submitted %s worker job %s (%s, --time %s)", node_type,
                        job_id, name, queue.slurm_time(limit))
            return job_id

    def terminate_node(self, node_id: str) -> dict[str, Any] | None:
        return self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> dict[str, Any] | None:
        ids = [i for i in node_ids if i != self._head_job]
        if not ids:
            return None
        with self._lock:
            # Only jobs carrying our id: a node id that is not (any more) ours is left alone.
            self._refresh(max_age=0)
            ours = [i for i in ids if i in self._rows or i in self._launched]
            if ours:
                done = _run(["scancel", *ours])
                if done.returncode != 0 and "Invalid job id" not in done.stderr:
                    last = done.stderr.strip().splitlines() or ["no output"]
                    raise SlurmError(f"scancel {' '.join(ours)} failed: {last[-1]}")
                logger.info("rayfleet: cancelled worker jobs %s", ", ".join(ours))
            self._cancelled.update(ids)
            for job_id in ids:
                self._launched.pop(job_id, None)
                self._rows.pop(job_id, None)
        return None

"""What the Slurm provider records in state (infra/core/state.py): the head's batch job."""

from __future__ import annotations

from typing import Any, ClassVar

from infra.core.state import Attrs


class Job(Attrs):
    """The head's batch job; its id is the job's name. The fields after `job_id` are copied from
    the info file the job writes (infra/node/slurm/node_helper.py), once it has."""

    KIND: ClassVar[str] = "slurm-job"

    #: Where it was submitted from (login host or this machine) and into which work dir.
    submitted_on: str | None = None
    workdir: str | None = None
    submitted_at: float | None = None
    job_id: str | None = None
    head_node: str | None = None
    head_ip: str | None = None
    port_base: int | None = None
    gcs_port: int | None = None
    dashboard_port: int | None = None
    client_port: int | None = None
    node_manager_port: int | None = None
    object_manager_port: int | None = None
    #: Every node of the job: name, ip, whether it is the head.
    nodes: list[dict[str, Any]] | None = None
    temp_dir: str | None = None
    ray_version: str | None = None
    python_version: str | None = None
    #: The `prometheus` the head runs, "" for none.
    prometheus: str | None = None

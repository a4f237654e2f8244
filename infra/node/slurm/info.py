"""Slurm's info file: what the head's job says of its Ray to the laptop, next to the job in the work
dir (`<job name>.json`). Written by the batch script's helper (node_helper.py: `prepare`, the head's
`watch`, `await`), read by `invoke up`, `status` and `teardown` (infra/providers/slurm/). Typed as
every file between the laptop and a head is (infra/node/wire.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from infra.node.wire import VERSION, Wire


@dataclass(frozen=True)
class Info(Wire):
    """One state of the head's job; every field `prepare` writes is in every file."""

    KIND = "Slurm's info file"

    #: starting, ready or failed.
    phase: str
    #: One line for `up` ("2/3 Ray nodes alive", or what failed).
    message: str
    job_id: str
    head_node: str
    head_ip: str
    #: The job's block of Ray ports (infra/node/rayproc.py PortBlock) and the ports in it.
    port_base: int
    gcs_port: int
    dashboard_port: int
    client_port: int
    node_manager_port: int
    object_manager_port: int
    #: The GCS, head_ip:gcs_port.
    address: str
    #: On the head's loopback only: reached through a tunnel that ends on the head's node.
    dashboard_url: str
    temp_dir: str
    cluster_id: str
    #: Epoch seconds: the batch script's start, and this file's write.
    started_at: float
    updated_at: float
    #: `metrics: prometheus` only: the `prometheus` the head's job runs, "" for none found.
    prometheus: str | None = None
    #: Once ready: the Ray nodes alive (ip, hostname, head, node_manager_port,
    #: object_manager_port), when, the start-up timeline, and the versions Ray runs with.
    nodes: list[dict[str, Any]] | None = None
    ready_at: float | None = None
    timeline: dict[str, float] | None = None
    ray_version: str | None = None
    python_version: str | None = None
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def facts(self, names: Iterable[str]) -> dict[str, Any]:
        """The named fields this file has a value for (None: not in this file, e.g. `nodes`
        before the job is ready), for a record of the job."""
        data = self.to_dict()
        return {name: data[name] for name in names if data.get(name) is not None}

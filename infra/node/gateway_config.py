"""The sharing gateway's config: what `up` writes beside it (infra/core/sharing/owner.py) and the gateway
reads at its start (infra/node/gateway.py). Standard library only: it ships to heads in the node
package, and the laptop's side imports it without the server.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from infra.node.files import atomic_write

CONFIG_FILE = "rayfleet-gateway.json"


@dataclass(frozen=True)
class Config:
    cluster: str
    host: str
    port: int
    #: The dashboard on the head, e.g. http://127.0.0.1:8265.
    upstream: str
    #: The cluster's Ray token file on the head; None when the cluster runs without auth.
    token_path: str | None
    cert: str
    key: str
    #: members.json, usage.json and audit.log (gateway_state.py).
    data_dir: str
    max_running_jobs_per_member: int = 2
    max_job_hours: float | None = None
    members_see_dashboard: bool = True
    #: One working-dir upload of a member, and all of a member's uploads together (MB).
    max_upload_mb: float = 100.0
    max_member_upload_mb: float = 2048.0
    #: Members' submits may carry runtime_env `pip` and `uv` (gateway_submit.py).
    members_may_pip: bool = False
    #: A member's next submit is refused once their jobs have run this many hours, or cost this
    #: many dollars (their share, gateway_state.Usage); None: no limit.
    member_budget_hours: float | None = None
    member_budget_usd: float | None = None
    #: No new jobs once the cluster's accrued cost reaches this many dollars; None: no limit.
    budget_usd: float | None = None
    #: The cluster's $/h without `node_prices` (no autoscaler: a fixed-size or local cluster),
    #: or when Ray names no nodes; split among the jobs running at each tick.
    price_per_hour: float = 0.0
    #: $/h of each node type of Ray's cluster config (the head's included): the price at a tick
    #: is that of the nodes alive then (gateway_prices.py). Empty: `price_per_hour` always.
    node_prices: dict[str, float] = field(default_factory=dict)
    #: The head's node type in `node_prices`.
    head_type: str = ""
    poll_seconds: float = 5.0
    #: Per member at once: connections open, uploads streaming, log tails (gateway_limits.py).
    max_member_connections: int = 16
    max_member_uploads: int = 2
    max_member_tails: int = 4
    #: Files whose content never appears in an answer to a member (the tracking password).
    secret_paths: list[str] = field(default_factory=list)
    #: `cluster`: each member reaches a Ray cluster of their own (gateway_isolated.py), run as
    #: `member_clusters_config` (member_clusters.StarterConfig) says; `shared`: the one cluster.
    isolation: str = "shared"
    member_clusters_config: str = ""


def config_text(config: Config) -> str:
    """The config file's whole text (what `write_config` writes, what a caller compares)."""
    return json.dumps(asdict(config), indent=2)


def write_config(path: Path, config: Config) -> None:
    atomic_write(path, config_text(config), mode=0o600)


def read_config(path: Path) -> Config:
    data = json.loads(path.read_text())
    return Config(**{f.name: data[f.name] for f in fields(Config) if f.name in data})

"""How this machine reaches a running cluster: the one type `jobs`, `doctor` and the providers share.

Core layer (providers return it from `connect`; the core never imports a provider to get it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Endpoint:
    """How this machine reaches a running cluster (through a tunnel for remote clusters)."""

    #: Dashboard / job submission URL reachable from here, e.g. http://127.0.0.1:28265.
    dashboard_url: str
    #: The Ray address as nodes of the cluster see it (host:gcs_port), for `ray start --address`.
    address: str
    #: True when `dashboard_url` is the local end of a tunnel that lives as long as the block.
    tunneled: bool = False
    #: The cluster's Ray token file (0600) that every request presents; None when auth is off.
    token_path: Path | None = None
    #: The MLflow tracking server reachable from here (`tracking: mlflow`), else None.
    tracking_url: str | None = None
    #: Its password file (0600; the user is `infra.core.tracking.client.USERNAME`).
    tracking_password: Path | None = None
    #: Ray Serve's HTTP endpoint reachable from here; None where the provider does not offer one.
    serve_url: str | None = None
    #: (host, port) Serve's proxy binds to on the head (`http_options` of every deploy).
    serve_bind: tuple[str, int] | None = None
    #: The cluster's Prometheus reachable from here (`metrics: prometheus`), else None.
    metrics_url: str | None = None

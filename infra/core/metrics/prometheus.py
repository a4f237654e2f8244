"""The cluster's Prometheus from this machine: starting it, asking it, keeping its history.

`metrics: prometheus` in a spec puts a real Prometheus on the head (infra/node/metrics.py). This
module is the laptop's side, the same for every provider: it reads Prometheus's HTTP API through
the endpoint the provider's `connect` gives (a tunnel for a remote head), reads Ray's job API for
the job timeline, and writes the kept copy of the history that `invoke report` draws after the
cluster is gone (`.rayfleet/metrics/<cluster>/history.json.gz`).

Core layer: never imports a provider.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
import time
from pathlib import Path
from typing import Any

from infra.core import auth, paths
from infra.core.endpoint import Endpoint
from infra.core.errors import RayfleetError
from infra.core.state import State
from infra.node.files import atomic_write
from infra.node.metrics import (
    CONFIG_FILE,
    DISCOVERY_FILE,
    PrometheusConfig,
    find_program,
)

__all__ = ["CONFIG_FILE", "DISCOVERY_FILE", "PrometheusConfig"]

#: Where a remote head's Prometheus listens: its loopback, like the dashboard (the cluster's
#: tunnel reaches it; no firewall rule opens it).
HEAD_PORT = 9090

HISTORY_FILE = "history.json.gz"
#: The kept copy's format; a reader refuses what it does not know.
HISTORY_VERSION = 1
#: At most this many points per series in the kept copy: a week at 10 s would be 60 000.
MAX_POINTS = 1500

#: What the report draws and `top` shows, as PromQL over Ray's own metrics.
#: Ray's node metrics carry `SessionName`, `NodeAddress` and (on autoscaled clusters)
#: `ray_node_type`-like labels; the autoscaler's carry `NodeType`.
SERIES = {
    # Nodes Ray's autoscaler counts, by type (the head included).
    "nodes_by_type": "sum by (NodeType) (autoscaler_active_nodes)",
    "pending_nodes": "sum by (NodeType) (autoscaler_pending_nodes)",
    # What the autoscaler is launching for demand the cluster cannot place yet, by resource. Ray's
    # autoscaler (v2's metrics_reporter.report_resources) sets this gauge only for resources it
    # has pending and never back to 0: counted only while a node is pending, else it would show
    # the last launch's resources forever.
    "pending_resources": ("sum by (resource) (autoscaler_pending_resources) * on() group_left() "
                          "(sum(autoscaler_pending_nodes) > bool 0)"),
    # Nodes that report metrics at all (every alive node's agent).
    "nodes_up": 'count(up{job="ray"} == 1 and on(instance) ray_node_cpu_count)',
    "cpu_total": "sum(ray_node_cpu_count)",
    "cpu_used": "sum(ray_node_cpu_utilization * ray_node_cpu_count) / 100",
    "gpu_total": "sum(ray_node_gpus_available)",
    "gpu_used": "sum(ray_node_gpus_utilization) / 100",
    "tpu_total": 'sum(ray_resources{Name="TPU"})',
    "tpu_used": 'sum(ray_resources{Name="TPU",State="USED"})',
    "mem_total": "sum(ray_node_mem_total)",
    "mem_used": "sum(ray_node_mem_used)",
}


class MetricsError(RayfleetError):
    """The cluster's Prometheus is off, not answering, or its history cannot be read."""


def history_dir(cluster: str) -> Path:
    return paths.home() / "metrics" / cluster


def history_path(cluster: str) -> Path:
    return history_dir(cluster) / HISTORY_FILE


def local_storage(cluster: str) -> Path:
    """A local head's time-series database: in the cluster's own dir under .rayfleet, bounded by
    the spec's `metrics_history`, removed by teardown once the history is kept."""
    return history_dir(cluster) / "tsdb"


def program_here() -> bool:
    """True when this machine has a `prometheus` to run for a local head."""
    return find_program() is not None


def note_started(state: State, scrape_interval_s: int) -> None:
    """Record that the cluster has metrics, since when (the first start: the history's origin)
    and how often it scrapes."""
    since = state.info.metrics_since or time.time()
    if (state.info.metrics_since, state.info.metrics_scrape_s) != (
            since, scrape_interval_s):
        state.set_info(metrics_since=since, metrics_scrape_s=scrape_interval_s)


# --- asking Prometheus -------------------------------------------------------------------------

def _get(url: str, path: str, params: dict[str, Any], timeout: float) -> Any:
    import requests

    try:
        answer = requests.get(f"{url}{path}", params=params, timeout=timeout)
        answer.raise_for_status()
        body = answer.json()
    except (requests.RequestException, ValueError) as exc:
        reason = ("connection refused" if isinstance(exc, requests.ConnectionError)
                  else str(exc).splitlines()[0][:160])
        raise MetricsError(f"the cluster's Prometheus at {url} is not answering ({reason}); "
                           "the head's supervisor starts it again within seconds (`invoke up` "
                           "if that is gone too); its history is kept") from None
    if body.get("status") != "success":
        raise MetricsError(f"Prometheus refused {params}: {body.get('error', 'no reason')}")
    return body["data"]


def require(endpoint: Endpoint) -> str:
    """The endpoint's Prometheus URL, or one line saying the cluster has none."""
    if not endpoint.metrics_url:
        raise MetricsError("this cluster runs no Prometheus (metrics: none in its spec, or "
                           "`up` found no `prometheus` on its head); set `metrics: prometheus` "
                           "and run `invoke up`")
    return endpoint.metrics_url


def query(url: str, promql: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """An instant query: [{"labels": {...}, "value": float}]."""
    data = _get(url, "/api/v1/query", {"query": promql}, timeout)
    return [{"labels": r["metric"], "value": float(r["value"][1])} for r in data["result"]]


def scalar(url: str, promql: str) -> float | None:
    found = query(url, promql)
    return sum(r["value"] for r in found) if found else None


def query_range(url: str, promql: str, start: float, end: float, step: float,
                timeout: float = 30.0) -> list[dict[str, Any]]:
    data = _get(url, "/api/v1/query_range",
                {"query": promql, "start": start, "end": end, "step": step}, timeout)
    return [{"labels": r["metric"], "values": [[float(t), float(v)] for t, v in r["values"]]}
            for r in data["result"]]


def targets(url: str) -> list[dict[str, Any]]:
    """Prometheus's active targets: [{"instance", "health", "last_error"}]."""
    data = _get(url, "/api/v1/targets", {"state": "active"}, 10.0)
    return [{"instance": t["labels"].get("instance", ""), "health": t["health"],
             "last_error": t.get("lastError", "")} for t in data["activeTargets"]]


# --- Ray's job API -----------------------------------------------------------------------------

def ray_jobs(endpoint: Endpoint) -> list[dict[str, Any]]:
    """Every job Ray knows: id, status, start/end (epoch s), entrypoint, member (on a shared
    cluster, from the job's `rayfleet_member` metadata)."""
    import requests

    try:
        answer = requests.get(f"{endpoint.dashboard_url}/api/jobs/",
                              headers=auth.headers(endpoint.token_path), timeout=10)
        answer.raise_for_status()
        found = answer.json()
    except (requests.RequestException, ValueError) as exc:
        raise MetricsError(f"Ray's job API at {endpoint.dashboard_url} did not answer "
                           f"({type(exc).__name__})") from None
    rows = []
    for job in found:
        metadata = job.get("metadata") or {}
        start, end = job.get("start_time"), job.get("end_time")
        rows.append({
            "job": str(job.get("submission_id") or job.get("job_id")),
            "status": str(job.get("status")),
            "start": start / 1000 if start else None,
            "end": end / 1000 if end else None,
            "entrypoint": str(job.get("entrypoint") or "")[:80],
            "member": str(metadata.get("rayfleet_member") or ""),
        })
    return sorted(rows, key=lambda r: r["start"] or 0)


# --- the history -------------------------------------------------------------------------------

def collect(url: str, since: float, until: float | None = None,
            scrape_interval_s: int = 10) -> dict[str, Any]:
    """Every series of SERIES from `since` to `until` (now), at most MAX_POINTS points each."""
    end = until or time.time()
    start = min(since, end - scrape_interval_s)
    step = max(float(scrape_interval_s), math.ceil((end - start) / MAX_POINTS))
    series = {name: query_range(url, promql, start, end, step) for name, promql in SERIES.items()}
    return {"since": start, "until": end, "step": step, "series": series}


def history(endpoint: Endpoint, cluster: str, since: float, hourly_usd_per_node: float | None,
            scrape_interval_s: int = 10) -> dict[str, Any]:
    """The whole picture of a running cluster, in the kept copy's format."""
    data = collect(require(endpoint), since, scrape_interval_s=scrape_interval_s)
    try:
        job_rows = ray_jobs(endpoint)
    except MetricsError:
        job_rows = []
    return {"version": HISTORY_VERSION, "cluster": cluster,
            "taken_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "hourly_usd_per_node": hourly_usd_per_node, **data, "jobs": job_rows}


def keep(cluster: str, data: dict[str, Any]) -> Path:
    """Write the kept copy (gzip'd JSON, 0600) and return its path."""
    path = history_path(cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0),
                 mode=0o600)
    return path


def load_kept(cluster: str) -> dict[str, Any]:
    path = history_path(cluster)
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except FileNotFoundError:
        raise MetricsError(f"cluster {cluster!r} has no metrics history: it is not running and "
                           f"nothing was kept in {path}; `invoke up` it with "
                           "`metrics: prometheus`") from None
    except (OSError, ValueError, EOFError) as exc:
        raise MetricsError(f"{path}: unreadable metrics history ({type(exc).__name__}); "
                           "remove it") from None
    if not isinstance(data, dict) or data.get("version") != HISTORY_VERSION:
        raise MetricsError(f"{path}: not a metrics history of this rayfleet; remove it")
    return data

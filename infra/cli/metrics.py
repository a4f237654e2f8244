"""`invoke top` and `invoke report`, and the history teardown keeps: the cluster's life in numbers.

Both read the head's Prometheus and Ray's APIs through the endpoint the provider's `connect` gives
(the cluster's tunnel for a remote head); `report` reads the copy teardown kept once the cluster
is gone. Commands layer: never branches on a provider's name.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

from infra.app import metrics_history
from infra.cli import common
from infra.core import jobs, state, ui
from infra.core.endpoint import Endpoint
from infra.core.metrics import prometheus as metrics
from infra.core.metrics import report, report_runs
from infra.core.metrics.prometheus import MetricsError
from infra.core.state import State
from infra.node.files import atomic_write
from infra.node.gateway_files import JobRecord
from infra.node.gateway_state import now_iso
from infra.providers.base import Provider

# --- top ---------------------------------------------------------------------------------------

def _by_ip(url: str, promql: str, label: str = "ip") -> dict[str, float]:
    found: dict[str, float] = {}
    for row in metrics.query(url, promql):
        key = row["labels"].get(label, "")
        found[key] = found.get(key, 0.0) + row["value"]
    return found


def _per_host(url: str, promql: str) -> dict[str, float]:
    """A host's measurement by IP, once: every Ray node's agent on a host reports the same
    host-wide numbers (a Slurm node may run two of the cluster's Ray nodes), so the agents of one
    IP are averaged, not added."""
    return _by_ip(url, f"avg by (ip) (sum by (ip, instance) ({promql}))")


def frame(endpoint: Endpoint, impl: Provider[Any, Any], current: State) -> dict[str, Any]:
    """One picture of the cluster now: nodes by type, demand, the autoscaler, jobs, cost."""
    url = metrics.require(endpoint)
    cpu = _per_host(url, "ray_node_cpu_count")
    cpu_used = _per_host(url, "ray_node_cpu_utilization * ray_node_cpu_count / 100")
    gpu = _per_host(url, "ray_node_gpus_available")
    gpu_used = _per_host(url, "ray_node_gpus_utilization / 100")
    mem = _per_host(url, "ray_node_mem_total")
    mem_used = _per_host(url, "ray_node_mem_used")
    # Each raylet reports its own reservations: added up per IP.
    reserved = {(r["labels"].get("NodeAddress", ""), r["labels"].get("Name", "")): r["value"]
                for r in metrics.query(
                    url, 'sum by (NodeAddress, Name) (ray_resources{State="USED"})')}
    alive = [node for node in jobs.list_nodes(endpoint) if node.state == "ALIVE"]
    # What is measured per IP is split evenly among the IP's Ray nodes: the cluster's totals
    # stay right however Slurm packs its nodes.
    sharing = collections.Counter(node.node_ip for node in alive)
    types: dict[str, dict[str, float]] = {}
    for node in alive:
        labels = node.labels or {}
        kind = labels.get("ray.io/node-group") or ("head" if node.is_head_node else "worker")
        total = node.resources_total or {}
        ip = node.node_ip

        def share(values: dict[Any, float], key: Any, ip: str = ip) -> float:
            return values.get(key, 0.0) / sharing[ip]

        row = types.setdefault(kind, {key: 0.0 for key in (
            "count", "cpu_total", "cpu_used", "cpu_reserved", "gpu_total", "gpu_used",
            "tpu_total", "tpu_reserved", "mem_total", "mem_used")})
        row["count"] += 1
        row["cpu_total"] += float(total.get("CPU", share(cpu, ip)))
        row["cpu_used"] += share(cpu_used, ip)
        row["cpu_reserved"] += share(reserved, (ip, "CPU"))
        row["gpu_total"] += float(total.get("GPU", share(gpu, ip)))
        row["gpu_used"] += share(gpu_used, ip)
        row["tpu_total"] += float(total.get("TPU", 0.0))
        row["tpu_reserved"] += share(reserved, (ip, "TPU"))
        row["mem_total"] += share(mem, ip)
        row["mem_used"] += share(mem_used, ip)
    pending = {r["labels"].get("resource", ""): r["value"]
               for r in metrics.query(url, metrics.SERIES["pending_resources"])
               if r["value"]}
    launching = {r["labels"].get("NodeType", ""): r["value"]
                 for r in metrics.query(url, "sum by (NodeType) (autoscaler_pending_nodes)")
                 if r["value"]}
    removed = metrics.scalar(url, "sum(increase(autoscaler_stopped_nodes_total[5m]))") or 0.0
    running = [j for j in metrics.ray_jobs(endpoint) if j["status"] in ("RUNNING", "PENDING")]
    per_node, accrued, source = metrics_history.rate_per_node(impl, current)
    nodes = sum(int(t["count"]) for t in types.values())
    return {
        "cluster": current.cluster, "time": time.time(),
        "nodes": [{"type": kind, **{k: (int(v) if k == "count" else round(v, 3))
                                    for k, v in row.items()}} for kind, row in types.items()],
        "pending": {"resources": pending, "launching": launching,
                    "removed_last_5m": round(removed)},
        "jobs": running,
        "cost": {"hourly_usd": None if per_node is None else round(per_node * nodes, 4),
                 "accrued_usd": accrued, "source": source},
    }


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f}"


def render_frame(data: dict[str, Any]) -> Any:
    """The frame as rich tables (what `top` refreshes)."""
    from rich.console import Group
    from rich.table import Table

    nodes = Table(title=f"cluster {data['cluster']!r}: nodes by type", title_justify="left")
    for column in ("type", "nodes", "CPU used/reserved/total", "GPU used/total",
                   "TPU reserved/total", "memory GiB used/total"):
        nodes.add_column(column)
    for row in data["nodes"]:
        nodes.add_row(row["type"], str(row["count"]),
                      f"{row['cpu_used']:.1f} / {row['cpu_reserved']:g} / {row['cpu_total']:g}",
                      f"{row['gpu_used']:.1f} / {row['gpu_total']:g}",
                      f"{row['tpu_reserved']:g} / {row['tpu_total']:g}",
                      f"{_gib(row['mem_used'])} / {_gib(row['mem_total'])}")
    pending = data["pending"]
    demand = ", ".join(f"{v:g} {k}" for k, v in pending["resources"].items()) or "none"
    launching = ", ".join(f"{v:g} × {k}" for k, v in pending["launching"].items()) or "nothing"
    cost = data["cost"]
    hourly = "unknown" if cost["hourly_usd"] is None else f"${cost['hourly_usd']:.2f}/h"
    accrued = "" if cost["accrued_usd"] is None else f", ${cost['accrued_usd']:.2f} so far"
    lines = [f"pending demand: {demand}; autoscaler launching: {launching}; removed in the last "
             f"5 min: {pending['removed_last_5m']}",
             f"cost: {hourly}{accrued}" + (f" ({cost['source']})" if cost["source"] else "")]
    running = Table(title="running jobs", title_justify="left")
    for column in ("job", "member", "status", "since", "entrypoint"):
        running.add_column(column)
    for job in data["jobs"]:
        since = time.strftime("%H:%M:%S", time.localtime(job["start"])) if job["start"] else ""
        running.add_row(job["job"], job["member"], job["status"], since, job["entrypoint"])
    return Group(nodes, *lines, running)


def top(impl: Provider[Any, Any], current: State, endpoint: Endpoint, once: bool,
        as_json: bool, interval: float = 3.0) -> None:
    if once or as_json:
        data = frame(endpoint, impl, current)
        if as_json:
            ui.out(json.dumps(data), markup=False, soft_wrap=True)
        else:
            ui.out(render_frame(data))
        return
    from rich.live import Live

    with Live(render_frame(frame(endpoint, impl, current)), refresh_per_second=1,
              screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render_frame(frame(endpoint, impl, current)))
        except KeyboardInterrupt:
            pass


# --- report ------------------------------------------------------------------------------------

def live_history(impl: Provider[Any, Any], current: State) -> dict[str, Any]:
    per_node, _, _ = metrics_history.rate_per_node(impl, current)
    with impl.connect(current) as endpoint:
        return metrics.history(endpoint, current.cluster, current.info.metrics_since or 0.0,
                               per_node, int(current.info.metrics_scrape_s or 10))


def term_data(impl: Provider[Any, Any], cluster: str, members: dict[str, Any] | None = None,
              since: float | None = None) -> tuple[dict[str, Any], str]:
    """The report's data over every run of `cluster` from `since` on (each run kept at its
    teardown, the running one live), and where it comes from. `members` (a shared cluster): the
    gateway's record, for the owner lane and the members' table (`member_report`)."""
    current = state.read(cluster)
    running = current is not None and not current.empty
    parts = report_runs.runs(cluster, since)
    if running and current is not None and current.info.metrics_since:
        parts = [p for p in parts if p.get("cluster_id") != current.cluster_id]
        parts.append({**live_history(impl, current), "cluster_id": current.cluster_id})
    if parts:
        data = report_runs.merge(cluster, parts, since)
        # A gone cluster's charts can only be the copies teardown kept: say so on the page.
        where = (f"{len(parts)} run(s) of {cluster!r}"
                 + (", the last live from its Prometheus" if running
                    else "; the cluster is gone, its charts are from the copy kept at teardown "
                         "of each run")
                 + f"; kept runs in {report_runs.runs_dir(cluster)}")
    elif members is not None:
        # A shared cluster without Prometheus (or gone with no history kept) still has the
        # gateway's record, kept here too: the members' table and their jobs over the cluster's
        # whole life, with no charts.
        data = _gateway_only(cluster, members["records"])
        why = ("the cluster runs no Prometheus" if running
               else "the cluster is gone and no metrics history of it was kept")
        where = (f"no charts: {why} (`metrics: prometheus` in its spec adds them); members and "
                 "jobs from the gateway's record")
    elif running:
        raise MetricsError(f"cluster {cluster!r} runs no Prometheus (metrics: none in its spec, "
                           "or none could be installed); set `metrics: prometheus` and run "
                           "`invoke up`")
    else:
        data = metrics.load_kept(cluster)  # its one line: nothing kept, and what to do
        where = "from the copy kept at teardown"
    if members is not None:
        records = members["records"]
        # Who ran a job is the gateway's record, not the metadata a job can set itself; a job
        # the gateway recorded that no kept history lists (a run without Prometheus) is added.
        listed = {job["job"] for job in data.get("jobs", [])}
        extra = _gateway_only(cluster, {k: v for k, v in records.items()
                                        if k not in listed})["jobs"]
        data = {**data, "members": members["rows"], "budget_of": members.get("budget_of", ""),
                "jobs": [{**job, "member": str(_member_of(records.get(job["job"])) or "owner")}
                         for job in [*data.get("jobs", []), *extra]
                         if since is None or float(job.get("start") or 0.0) >= since]}
    return data, where


def write_report(impl: Provider[Any, Any], cluster: str, out: Path | None,
                 members: dict[str, Any] | None = None, since: float | None = None) -> Path:
    """Write the report page over every run of `cluster` (see `term_data`)."""
    data, where = term_data(impl, cluster, members, since)
    path = out or Path(f"{cluster}-report.html")
    atomic_write(path, report.build(data, where))
    return path


def _member_of(record: JobRecord | None) -> str | None:
    return record.member if record is not None else None


def _gateway_only(cluster: str, records: dict[str, JobRecord]) -> dict[str, Any]:
    """A report's data from the gateway's job records alone (times in Ray's milliseconds)."""
    now = time.time()
    # The gateway writes no entrypoint: one a record holds (`extra`) is shown, none is "".
    jobs: list[dict[str, Any]] = [{"job": job, "status": str(entry.status or "?"),
             "start": float(entry.start_time) / 1000,
             "end": float(entry.end_time) / 1000 if entry.end_time else now,
             "entrypoint": str(entry.extra.get("entrypoint") or "")}
            for job, entry in records.items() if entry.start_time]
    since = min((float(j["start"]) for j in jobs), default=now - 3600)
    return {"cluster": cluster, "since": since, "until": now, "step": 60.0, "series": {},
            "jobs": sorted(jobs, key=lambda j: j["start"]), "taken_at": now_iso()}


def member_report(selected: Any, impl: Provider[Any, Any]) -> dict[str, Any]:
    """A shared cluster's members over its whole life, from the gateway's usage (not only the
    Prometheus window): a row per member, and the gateway's record of every job."""
    from infra.cli import sharing as commands_sharing
    from infra.core.sharing import owner as sharing
    from infra.core.sharing import term_people

    current = state.read(selected.name)
    rows = commands_sharing.member_rows(selected, impl, current)
    # One row per person for the term: a name removed and added again is one person.
    return {"rows": term_people.people(rows, selected.sharing),
            "budget_of": term_people.budget_of(selected.sharing),
            "records": sharing.job_records(sharing.read_usage(selected, None))}


# --- the verbs ---------------------------------------------------------------------------------

def top_command(provider: str | None, cluster: str | None, once: bool, as_json: bool) -> None:
    selected, impl = common.select(provider, cluster)
    current = common.running(selected)
    with impl.connect(current) as endpoint:
        top(impl, current, endpoint, once, as_json)


def report_command(provider: str | None, cluster: str | None, out: str | None,
                   as_json: bool = False, since: str | None = None) -> None:
    selected, impl = common.select(provider, cluster)
    start = report_runs.since_of(since)
    members = member_report(selected, impl) if selected.sharing is not None else None
    if as_json:
        data, where = term_data(impl, selected.name, members, start)
        ui.out(json.dumps(report.as_json(data, where), indent=2), markup=False, soft_wrap=True)
        return
    path = write_report(impl, selected.name, Path(out) if out else None, members, start)
    size = path.stat().st_size
    ui.out(f"report written to {path} ({size / 1024:.0f} KiB; opens offline in any browser)",
           markup=False, soft_wrap=True)

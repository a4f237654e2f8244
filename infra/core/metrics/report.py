"""From a metrics history (infra/core/metrics/prometheus.py's format) to `invoke report`'s page (report_html).

What is drawn: nodes by type against pending demand, utilization per resource, the job timeline
(a lane per member on a shared cluster), and what the cluster cost (dollars where the provider
knows a price, node-hours elsewhere).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from infra.core.metrics import report_html
from infra.core.metrics.report_html import Points

#: The charts every report has, by `data-chart` name (the browser test checks each).
CHARTS = ("nodes", "utilization", "jobs", "cost")


def _lines(series: list[dict[str, Any]], label: str, default: str) -> list[tuple[str, Points]]:
    return [(str(s["labels"].get(label) or default), [(t, v) for t, v in s["values"]])
            for s in series]


def _total(series: list[dict[str, Any]]) -> dict[float, float]:
    summed: dict[float, float] = {}
    for s in series:
        for t, v in s["values"]:
            summed[t] = summed.get(t, 0.0) + v
    return summed


def _ratio(used: dict[float, float], total: dict[float, float]) -> Points:
    return [(t, 100.0 * used.get(t, 0.0) / total[t]) for t in sorted(total) if total[t] > 0]


def _readable(name: str) -> str:
    """A legend's name: a node type that is a raw id (a local node's) as `node <first 8>`."""
    return f"node {name[:8]}" if re.fullmatch(r"[0-9a-f]{16,}", name) else name


def node_count(series: dict[str, list[dict[str, Any]]]) -> dict[float, float]:
    """Nodes in the cluster at each sampled time (seconds since the epoch)."""
    by_type = _total(series.get("nodes_by_type", []))
    up = _total(series.get("nodes_up", []))
    # Where both were sampled, never more than the nodes up: a run's Prometheus stopped at
    # teardown writes no staleness marker, so a later run on the same store still answers the
    # gone head's `autoscaler_active_nodes` series for 5 minutes (Prometheus's lookback).
    return {t: min(v, up[t]) if t in up else v for t, v in by_type.items()} if by_type else up


def _accrued(nodes: dict[float, float], rate: float) -> Points:
    """Cumulative node-hours (rate 1) or dollars: the node count held until the next sample."""
    points: Points = []
    total, last = 0.0, None
    for t in sorted(nodes):
        if last is not None:
            total += nodes[last] * (t - last) / 3600 * rate
        points.append((t, total))
        last = t
    return points


def build(data: dict[str, Any], where: str) -> str:
    series: dict[str, list[dict[str, Any]]] = data["series"]
    demand = [(f"pending {name} (demand)", pts) for name, pts in
              _lines(series.get("pending_resources", []), "resource", "?") if any(v for _, v in pts)]
    # A type that never had a node (a local head's unused default type) is noise.
    nodes = [(_readable(name), pts) for name, pts in _lines(series.get("nodes_by_type", []),
                                                            "NodeType", "nodes")
             if any(v for _, v in pts)]
    if not nodes:
        nodes = [("nodes", [(t, v) for t, v in sorted(_total(series.get("nodes_up", [])).items())])]
    launching = [(f"launching {name}", pts) for name, pts in
                 _lines(series.get("pending_nodes", []), "NodeType", "?") if any(v for _, v in pts)]
    utilization = []
    for resource, used, total in (("CPU", "cpu_used", "cpu_total"), ("GPU", "gpu_used", "gpu_total"),
                                  ("TPU", "tpu_used", "tpu_total"),
                                  ("memory", "mem_used", "mem_total")):
        points = _ratio(_total(series.get(used, [])), _total(series.get(total, [])))
        if points:
            utilization.append((resource, points))
    rate = data.get("hourly_usd_per_node")
    counts = node_count(series)
    if rate:
        cost_chart = report_html.line_chart("cost", [("$ accrued", _accrued(counts, rate))], " $")
        cost_note = f"estimate: ${rate:.2f}/h per node (the provider's price at the time)"
    else:
        cost_chart = report_html.line_chart("cost", [("node-hours", _accrued(counts, 1.0))], " h")
        cost_note = ("node-hours (this provider bills no money through rayfleet)" if rate is None
                     else "free: runs on this machine; node-hours shown")
    start, end = float(data["since"]), float(data["until"])
    sections = [
        ("Nodes by type and pending demand",
         report_html.line_chart("nodes", [*nodes, *launching, *demand], step=True),
         "nodes Ray's autoscaler counts, by type; what it is launching; resources requested "
         "that no node could hold yet"),
        ("Utilization per resource",
         report_html.line_chart("utilization", utilization, "%", top=100.0),
         "CPU and memory as the nodes measure them; GPU and TPU as Ray's agents report them"),
        ("Jobs", report_html.timeline("jobs", data.get("jobs", []), start, end),
         "one lane per member on a shared cluster, else per job; green: succeeded, red: failed, "
         "blue: running or stopped"),
        ("Cost accrued", cost_chart, cost_note),
    ]
    if data.get("members") is not None:
        owner_lane = any(job.get("member") == "owner" for job in data.get("jobs", []))
        sections.append(("Members", report_html.table(
            ["member", "role", "status", "jobs", "job-hours", "cost share",
             f"budget used (of {data.get('budget_of') or 'no budget'})", "history"],
            [_member_cells(m) for m in data["members"]]),
            "every member's jobs over the cluster's whole life, from the gateway's record (removed "
            "members' jobs stay theirs); " + ("the owner's own jobs are in the owner lane above"
                                              if owner_lane else "the owner's own jobs, which "
                                              "only Ray's record holds, are not in this report")))
    span = dt.timedelta(seconds=round(end - start))
    subtitle = (f"{_utc(start)} to {_utc(end)} UTC ({span}), one point every {data['step']:g} s; "
                f"{where}; taken at {data.get('taken_at', '?')}")
    return report_html.page(f"Cluster {data['cluster']}", subtitle, sections, data.get("jobs", []))


def _member_cells(m: dict[str, Any]) -> list[str]:
    from infra.core.sharing import term as sharing_term
    from infra.core.sharing import term_people

    used = m.get("budget_used")
    history = ", ".join([f"{e['event']} {sharing_term.shown(e['at'])}"
                         for e in m.get("history") or []]
                        + ([term_people.cluster_words(m["cluster"])] if m.get("cluster") else []))
    return [m["name"], m.get("role") or "", str(m.get("status") or ""),
            str(m.get("total_jobs", 0)), f"{float(m.get('job_hours') or 0):.2f} h",
            f"${float(m.get('cost_share_usd') or 0):.2f}",
            "" if used is None else f"{float(used):.0%}", history]


def node_hours(data: dict[str, Any]) -> float:
    """Node-hours over the whole history (each count held until its next sample)."""
    points = _accrued(node_count(data["series"]), 1.0)
    return round(points[-1][1], 6) if points else 0.0


def as_json(data: dict[str, Any], where: str) -> dict[str, Any]:
    """`report --json`: every job, member and node-hour, for grading and scripts (ISO 8601)."""
    def iso(t: Any) -> str | None:
        return None if t is None else dt.datetime.fromtimestamp(
            float(t), dt.timezone.utc).isoformat(timespec="seconds")

    return {"cluster": data["cluster"], "source": where, "since": iso(data.get("since")),
            "until": iso(data.get("until")), "node_hours": node_hours(data),
            "hourly_usd_per_node": data.get("hourly_usd_per_node"),
            "runs": [{**r, "since": iso(r.get("since")), "until": iso(r.get("until"))}
                     for r in data.get("runs") or []],
            "jobs": [{**j, "start": iso(j.get("start")), "end": iso(j.get("end"))}
                     for j in data.get("jobs") or []],
            "members": data.get("members")}


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

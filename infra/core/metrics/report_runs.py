"""One record for the term: every run of a cluster's name kept as its own file, never overwritten.

    .rayfleet/metrics/<cluster>/runs/<cluster_id>.json.gz   one run's history (prometheus.py's
                                                             format), 0600
    .rayfleet/metrics/<cluster>/runs/index.json             [{cluster_id, file, since, until,
                                                              taken_at, jobs}], oldest first

A run is one `up` to its `teardown` (one cluster id); its file is rewritten only by a later copy
of the same run (a later copy holds more). `history.json.gz`, the one copy earlier versions kept,
is read as one more run. `report` merges every run from `--since` on: each run's node counts
drop to 0 at its end, so no gone node is carried into the next run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import json
import math
import re
from pathlib import Path
from typing import Any

from infra.core.errors import UsageError
from infra.core.metrics import prometheus as metrics
from infra.node.files import atomic_write

INDEX_FILE = "index.json"
#: Series that count nodes: after a run they are 0, not their last value.
COUNTS = ("nodes_by_type", "nodes_up", "pending_nodes")
_ID = re.compile(r"[A-Za-z0-9_.-]{1,80}")


def runs_dir(cluster: str) -> Path:
    return metrics.history_dir(cluster) / "runs"


def _index(cluster: str) -> list[dict[str, Any]]:
    try:
        found = json.loads((runs_dir(cluster) / INDEX_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def keep_run(cluster: str, cluster_id: str, data: dict[str, Any]) -> Path:
    """Keep one run's history under its cluster id and list it in the index; the file's path."""
    if not _ID.fullmatch(cluster_id):
        raise UsageError(f"cluster id {cluster_id!r}: not a file name; the state file is damaged")
    folder = runs_dir(cluster)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{cluster_id}.json.gz"
    atomic_write(path, gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0),
                 mode=0o600)
    entry = {"cluster_id": cluster_id, "file": path.name, "since": data.get("since"),
             "until": data.get("until"), "taken_at": data.get("taken_at"),
             "jobs": len(data.get("jobs") or [])}
    index = [e for e in _index(cluster) if e.get("cluster_id") != cluster_id] + [entry]
    index.sort(key=lambda e: float(e.get("since") or 0.0))
    atomic_write(folder / INDEX_FILE, json.dumps(index, indent=2), mode=0o600)
    return path


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError):
        return None
    return data if isinstance(data, dict) and data.get("version") == metrics.HISTORY_VERSION \
        else None


def since_of(text: str | None) -> float | None:
    """`--since DATE` (a date or an ISO datetime, UTC unless it says otherwise) as epoch seconds."""
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since {text!r}: give a date like 2026-09-01 (the term's first "
                         "day, UTC) or an ISO datetime") from None
    return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()


def runs(cluster: str, since: float | None = None) -> list[dict[str, Any]]:
    """Every kept run of `cluster` that reaches past `since`, oldest first (with `cluster_id`)."""
    found: list[dict[str, Any]] = []
    for entry in _index(cluster):
        data = _read(runs_dir(cluster) / str(entry.get("file")))
        if data is not None:
            found.append({**data, "cluster_id": entry.get("cluster_id")})
    legacy = None
    if metrics.history_path(cluster).exists():
        with contextlib.suppress(metrics.MetricsError):
            legacy = metrics.load_kept(cluster)
    if legacy is not None and not any(r.get("since") == legacy.get("since") for r in found):
        found.append({**legacy, "cluster_id": "kept-before-runs"})
    found = [r for r in found if since is None or float(r.get("until") or 0.0) >= since]
    return sorted(found, key=lambda r: float(r.get("since") or 0.0))


def merge(cluster: str, parts: list[dict[str, Any]], since: float | None = None) -> dict[str, Any]:
    """One history over several runs: series joined by their labels, a node count 0 from each
    run's end; every job once (the later copy wins); the runs listed."""
    series: dict[str, dict[str, dict[str, Any]]] = {}
    jobs: dict[str, dict[str, Any]] = {}
    for part in parts:
        start = max(float(part["since"]), since or 0.0)
        end = float(part["until"])
        for name, rows in (part.get("series") or {}).items():
            for row in rows:
                key = json.dumps(row.get("labels") or {}, sort_keys=True)
                merged = series.setdefault(name, {}).setdefault(
                    key, {"labels": row.get("labels") or {}, "values": []})
                points = [(float(t), float(v)) for t, v in row.get("values") or []
                          if start <= float(t) <= end]
                if points and name in COUNTS:
                    # The run ended: its nodes are gone (just after its last sample).
                    points.append((math.nextafter(max(end, points[-1][0]), math.inf), 0.0))
                merged["values"].extend(points)
        for job in part.get("jobs") or []:
            if since is None or float(job.get("start") or end) >= since:
                jobs[str(job["job"])] = {**job, "run": part.get("cluster_id")}
    for by_labels in series.values():
        for row in by_labels.values():
            row["values"].sort()
    last = parts[-1] if parts else {}
    rates = [p.get("hourly_usd_per_node") for p in parts if p.get("hourly_usd_per_node") is not None]
    return {"version": metrics.HISTORY_VERSION, "cluster": cluster,
            "since": max(min((float(p["since"]) for p in parts), default=0.0), since or 0.0),
            "until": max((float(p["until"]) for p in parts), default=0.0),
            "step": max((float(p.get("step") or 0.0) for p in parts), default=60.0),
            "hourly_usd_per_node": rates[-1] if rates else None,
            "taken_at": last.get("taken_at"),
            "series": {name: list(rows.values()) for name, rows in series.items()},
            "jobs": sorted(jobs.values(), key=lambda j: float(j.get("start") or 0.0)),
            "runs": [{"cluster_id": p.get("cluster_id"), "since": p.get("since"),
                      "until": p.get("until")} for p in parts]}

"""The history of a cluster's metrics that teardown keeps, and what its nodes cost per hour.

The library's `teardown` (lifecycle.py) calls `keep_before_teardown` before any machine goes;
`invoke top` and `invoke report` (infra/cli/metrics.py) read the same prices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.app.progress import Progress, Step, timed
from infra.core.errors import RayfleetError
from infra.core.metrics import prometheus as metrics
from infra.core.metrics import report_runs
from infra.core.state import State
from infra.providers.base import Provider, ProviderStatus


def rate_per_node(impl: Provider[Any, Any], current: State,
                  status: ProviderStatus | None = None) -> tuple[float | None, float | None, str]:
    """($/h per node now, $ accrued, where the prices come from), as the provider knows them."""
    try:
        cost = (status or impl.status(current)).cost
    except RayfleetError:
        return None, None, ""
    if cost is None:
        return None, None, ""
    per_node = cost.hourly_usd / cost.nodes if cost.hourly_usd is not None and cost.nodes else (
        0.0 if cost.hourly_usd == 0 else None)
    return per_node, cost.accrued_usd, cost.source


def keep_before_teardown(impl: Provider[Any, Any], current: State,
                         progress: Progress) -> Path | None:
    """Copy the cluster's metrics history here before any machine goes and return where, or say
    why not (a warning through `progress`) and return None."""
    since = current.info.metrics_since
    if not since:
        return None
    kept = report_runs.runs_dir(current.cluster)
    earlier = f"; earlier runs are kept in {kept}" if kept.exists() else ""
    try:
        status = impl.status(current)
    except RayfleetError:
        status = None
    if status is not None and not status.running:
        # A head that removed itself (autodown) took the history along: nothing to reach.
        progress(Step(f"metrics history NOT kept: the cluster's head is not running{earlier}",
                      "warn"))
        return None
    try:
        with timed(progress, "keeping the cluster's metrics history"):
            per_node, _, _ = rate_per_node(impl, current, status)
            with impl.connect(current) as endpoint:
                data = metrics.history(endpoint, current.cluster, float(since), per_node,
                                       int(current.info.metrics_scrape_s or 10))
            # Its own file, by cluster id: a later run never overwrites this one.
            path = report_runs.keep_run(current.cluster, current.cluster_id, data)
    except (RayfleetError, OSError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        progress(Step(f"metrics history NOT kept ({reason}){earlier}", "warn"))
        return None
    return path

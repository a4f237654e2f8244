"""`invoke list`: every cluster this checkout knows, each provider asked in parallel.

Figures come from each provider's `status` (`ProviderStatus.cost`); this module only gathers and
prints them, and never branches on a provider's name. A provider that does not answer within its
timeout (`Provider.status_timeout_s`, or `--timeout`) gets a row saying so: its check keeps running
in a daemon thread that is abandoned, so one dead endpoint never holds up the others or the exit.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.core import paths, ui
from infra.core.costs import duration, usd
from infra.core.errors import RayfleetError
from infra.node import wait

if TYPE_CHECKING:
    from infra.core.spec import ClusterSpec
    from infra.core.state import State
    from infra.providers.base import ProviderStatus


@dataclass
class Row:
    """One cluster in `invoke list`."""

    cluster: str
    provider: str
    cluster_id: str = ""
    #: The provider's word for it now, or why it could not be asked.
    state: str = "?"
    #: False when the provider did not answer (timeout or error): the figures are unknown.
    reachable: bool = True
    error: str | None = None
    nodes: int | None = None
    hourly_usd: float | None = None
    uptime_s: float | None = None
    accrued_usd: float | None = None
    node_hours: float | None = None
    cost_source: str = ""
    autodown_minutes: float | None = None
    autodown: str = ""
    spec: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _spec_for(current: State) -> ClusterSpec:
    """The spec `up` used (recorded in state), else clusters/<name>.yaml."""
    from infra.cli import loading
    from infra.core import spec

    recorded = current.info.spec_path
    path = Path(recorded) if recorded else spec.spec_path(current.cluster)
    return loading.load_spec(path)


def _check(row: Row, current: State, result: dict[str, Any]) -> None:
    """Runs in its own daemon thread: the provider's status, or the error it raised."""
    from infra import providers

    try:
        selected = _spec_for(current)
    except RayfleetError as exc:  # the spec moved or broke: the provider was never asked
        result["spec_error"] = str(exc).splitlines()[0][:300]
        return
    try:
        impl = providers.create(selected)
        result["spec"] = selected
        result["timeout"] = impl.status_timeout_s
        result["status"] = impl.status(current)
    except RayfleetError as exc:
        result["error"] = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    except Exception as exc:  # never a traceback in a listing: one provider's bug is one row
        result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _fill(row: Row, status: ProviderStatus) -> None:
    row.state = status.state_label
    cost = status.cost
    if cost is not None:
        row.nodes, row.hourly_usd, row.uptime_s = cost.nodes, cost.hourly_usd, cost.uptime_s
        row.accrued_usd, row.node_hours, row.cost_source = cost.accrued_usd, cost.node_hours, cost.source
    if status.autodown is not None:
        from infra.core.autodown import view as autodown_view

        row.autodown = autodown_view.describe(status.autodown)


def _start_checks(rows: list[Row]) -> list[tuple[Row, threading.Thread, dict[str, Any]]]:
    """A row per state file (added to `rows`), and its provider's check started in a thread."""
    from infra.core.state import State

    checks: list[tuple[Row, threading.Thread, dict[str, Any]]] = []
    for path in sorted(paths.state_dir().glob("*.json")):
        try:
            current = State.load(path)
        except RayfleetError as exc:
            rows.append(Row(path.stem, "?", state="state unreadable", reachable=False,
                            error=str(exc)))
            continue
        if current is None:
            continue
        row = Row(current.cluster, current.provider, current.cluster_id,
                  spec=str(current.info.spec_path or ""))
        result: dict[str, Any] = {}
        thread = threading.Thread(target=_check, args=(row, current, result), daemon=True,
                                  name=f"list-{current.cluster}")
        thread.start()
        rows.append(row)
        checks.append((row, thread, result))
    return checks


def _settle(row: Row, alive: bool, result: dict[str, Any], limit: float) -> str | None:
    """Fill the row from its check's answer; why the provider could not be asked, if it could
    not (None when it answered or the spec was unreadable, which `gather` warns of itself)."""
    spec_ = result.get("spec")
    if spec_ is not None:
        row.autodown_minutes = spec_.autodown.idle_minutes if spec_.autodown else None
        row.autodown = (f"{row.autodown_minutes:g} min" if spec_.autodown else "off")
    if "spec_error" in result:
        row.reachable, row.state = False, "spec unreadable"
        row.error = f"{result['spec_error']}; `invoke list` needs the spec `up` used"
        return None
    if alive:
        row.reachable, row.state = False, "UNREACHABLE"
        row.error = f"no answer from {row.provider} within {limit:g}s"
    elif "error" in result:
        row.reachable, row.state, row.error = False, "UNREACHABLE", result["error"]
    else:
        status: ProviderStatus = result["status"]
        setting = row.autodown
        _fill(row, status)
        if status.autodown is None or not status.autodown.removed_at:
            row.autodown = setting if status.autodown is None else f"{setting}; {row.autodown}"
        return None
    return row.error or ""


def gather(timeout: float | None = None) -> tuple[list[Row], list[str]]:
    """A row per state file, every provider asked at once; and warnings for those that failed."""
    rows: list[Row] = []
    warnings: list[str] = []
    checks = _start_checks(rows)
    started = time.monotonic()
    failed: dict[str, str] = {}

    def budget(result: dict[str, Any]) -> float:
        # Each provider's own (known once its check has read the spec), counted from the common
        # start: the checks run side by side.
        return timeout if timeout is not None else float(result.get("timeout", 20.0))

    def ended(thread: threading.Thread, result: dict[str, Any]) -> bool:
        return not thread.is_alive() or time.monotonic() - started >= budget(result)

    for row, thread, result in checks:
        wait.until(functools.partial(ended, thread, result), math.inf, 0.05)
        reason = _settle(row, thread.is_alive(), result, budget(result))
        if "spec_error" in result:
            warnings.append(f"{row.cluster}: {row.error}")
        elif reason is not None:
            failed.setdefault(row.provider, reason)
    for provider, reason in failed.items():
        warnings.append(f"{provider}: could not ask for the current state ({reason}); its rows "
                        "show what state files know")
    return rows, warnings


def list_clusters(as_json: bool, timeout: float | None) -> int:
    rows, warnings = gather(timeout)
    if as_json:
        ui.out(json.dumps({"clusters": [_as_dict(r) for r in rows], "warnings": warnings},
                          indent=2), soft_wrap=True, markup=False)
    else:
        _print(rows)
    for warning in warnings:
        ui.warn(warning)
    return 0


def _as_dict(row: Row) -> dict[str, Any]:
    data = dict(row.__dict__)
    data.pop("extra")
    return data


def _print(rows: list[Row]) -> None:
    if not rows:
        ui.out(f"no clusters: no state files in {paths.state_dir()}")
        return
    from rich.table import Table

    table = Table(title="clusters of this checkout")
    for column in ("cluster", "provider", "state", "nodes", "$/h now", "uptime", "accrued",
                   "autodown"):
        table.add_column(column)
    total_hourly = 0.0
    for r in rows:
        accrued = usd(r.accrued_usd) if r.accrued_usd is not None else (
            f"{r.node_hours:.2f} node-h" if r.node_hours is not None else "?")
        hourly = usd(r.hourly_usd) if r.hourly_usd is not None else (
            "-" if r.node_hours is not None else "?")
        total_hourly += r.hourly_usd or 0.0
        state = r.state if r.reachable else f"{r.state}: {r.error}"
        table.add_row(r.cluster, r.provider, state, "?" if r.nodes is None else str(r.nodes),
                      hourly, duration(r.uptime_s), accrued, r.autodown or "?")
    ui.out(table)
    estimates = sorted({r.cost_source for r in rows if r.cost_source.startswith("estimate")})
    ui.out(f"total now: {usd(total_hourly)}/h"
           + (f"; {', '.join(estimates)}" if estimates else ""), markup=False)

"""What a cluster costs, as one line of text: the cost lines of `plan`, `up`, `status`, `list` and
`sweep`, and the one way rayfleet writes an amount of money (`usd`, always in US dollars).

Figures come from each provider's `status` (`ProviderStatus.cost`) and `cost_range`; this module
only words them, and never branches on a provider's name. `invoke list` is infra/cli/listing.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.core.spec import ClusterSpec


@dataclass(frozen=True)
class Cost:
    """What a cluster costs right now, as the provider knows it. Unknown figures are None."""

    #: Nodes that count now (instances, VMs, TPU hosts, Slurm nodes), head included.
    nodes: int
    #: Dollars per hour now; None where the provider bills no money (Slurm) or knows no price.
    hourly_usd: float | None = None
    #: Seconds since the cluster's oldest running node started.
    uptime_s: float | None = None
    #: Dollars spent so far by the nodes running now (each node's price times its uptime).
    accrued_usd: float | None = None
    #: Node-hours used so far, for providers that account in time rather than money (Slurm).
    node_hours: float | None = None
    #: Where the prices come from, e.g. "Lambda /instance-types" or "estimate: rayfleet's GCP
    #: price table of 2026-11-01"; shown next to every figure.
    source: str = ""


@dataclass(frozen=True)
class CostRange:
    """What an autoscaling cluster costs per hour at its smallest and at its largest."""

    min_nodes: int
    max_nodes: int
    #: $/h at min and at max size; None when there is no price (Slurm) or it is unknown.
    min_hourly_usd: float | None = None
    max_hourly_usd: float | None = None
    #: As `Cost.source`.
    source: str = ""
    #: True when the provider bills node-hours, not money (Slurm): the range is shown in
    #: node-hours per hour, one per node.
    node_hours: bool = False
    #: $/h of each node type, for the sharing gateway's cost share; None when a type has no
    #: known price.
    node_prices: NodePrices | None = None


@dataclass(frozen=True)
class NodePrices:
    """$/h of each node type of the cluster's Ray config, from a provider's price data
    (`CostRange.node_prices`), for the sharing gateway's cost share: on the head, the price at
    each moment is that of the nodes Ray knows then (infra/node/gateway_prices.py)."""

    #: The head's node type (a key of `by_type`).
    head_type: str
    #: $/h by node type name, as named in the Ray cluster config; empty without an autoscaler.
    by_type: Mapping[str, float]
    #: $/h when Ray names no nodes (its dashboard does not answer): the minimum size's.
    floor_usd: float


def usd(dollars: float | None) -> str:
    """An amount in US dollars (never cents), e.g. "$1,234.50"; "?" when unknown."""
    return "?" if dollars is None else f"${dollars:,.2f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return str(dt.timedelta(seconds=int(seconds)))


def describe_cost(cost: Cost) -> str:
    """e.g. "3 node(s), $2.37/h now, up 1:02:03, accrued $2.45 (Lambda /instance-types)"."""
    parts = [f"{cost.nodes} node(s)"]
    free = cost.hourly_usd == 0 and not cost.accrued_usd
    if free:
        parts.append("free")
    elif cost.hourly_usd is not None:
        parts.append(f"{usd(cost.hourly_usd)}/h now")
    if cost.uptime_s is not None:
        parts.append(f"up {duration(cost.uptime_s)}")
    if cost.accrued_usd is not None and not free:
        parts.append(f"accrued {usd(cost.accrued_usd)}")
    if cost.node_hours is not None:
        parts.append(f"{cost.node_hours:.2f} node-hours so far")
    return ", ".join(parts) + (f" ({cost.source})" if cost.source else "")


def describe_range(cost: CostRange) -> str:
    """e.g. "cost: $0.50/h at minimum size (1 node) to $10.50/h at maximum size (5 nodes)"."""
    def at(nodes: int, hourly: float | None) -> str:
        if cost.node_hours:
            return f"{nodes} node-hour{'s' if nodes != 1 else ''}/h"
        money = f"{usd(hourly)}/h" if hourly is not None else "no price"
        return f"{money} ({nodes} node{'s' if nodes != 1 else ''})"

    source = f" ({cost.source})" if cost.source else ""
    if cost.min_nodes == cost.max_nodes and cost.min_hourly_usd == cost.max_hourly_usd:
        return f"cost: {at(cost.max_nodes, cost.max_hourly_usd)}, fixed size{source}"
    return (f"cost: {at(cost.min_nodes, cost.min_hourly_usd)} at minimum size to "
            f"{at(cost.max_nodes, cost.max_hourly_usd)} at maximum size{source}")


def describe_autodown(selected: ClusterSpec) -> str:
    if selected.autodown is None:
        why = " (autodown: null)" if selected.autodown_turned_off else ""
        return f"autodown: off{why}; the cluster runs until `invoke teardown`"
    return (f"autodown: the whole cluster removes itself after {selected.autodown.idle_minutes:g} "
            "idle minutes (no job, task, actor or driver)")

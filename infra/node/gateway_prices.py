"""The cluster's $/h for the sharing gateway's cost share (infra/node/gateway.py): the nodes alive
now, each at its node type's price (`Config.node_prices`, from infra/core/costs.py NodePrices).

Ray names a node's type in two places, and neither is there in every setup:
- Ray's v1 autoscaler writes its report (`autoscaler_report`: active and launching nodes by type)
  where the dashboard's `/api/cluster_status` answers it. Ray's v2 autoscaler writes none (only
  ray/autoscaler/_private/monitor.py stores that key): there the answer's `clusterStatus` is null.
- Ray's GCS node table, which the dashboard's state API lists at `/api/v0/nodes`: every node
  with `is_head_node` and its labels, among them `ray.io/node-group`, which `ray start` sets from
  `RAY_NODE_TYPE_NAME`. Ray's v2 autoscaler exports that variable to the start commands of every
  node it launches (ray/autoscaler/v2/instance_manager/ray_installer.py), `ray up` to the head's
  when v2 is on; Ray's v1 autoscaler does not, so its workers carry no type there.

So the v1 report when there is a current one (it also counts nodes still launching, which are
billed already), else the node table (v2, or a v1 monitor that went quiet: nodes count from when
Ray runs on them), else the fixed price. The head counts always, at its type's price: the gateway
runs on it. A node of a type without a price counts 0. Clusters without node prices (no
autoscaler: the fixed price; local and Slurm: $0) never ask Ray. Standard library only (node rule).
"""

from __future__ import annotations

import collections
from typing import Any

#: Ray's GCS node table, alive nodes only (dead ones stay listed for a while), with labels.
NODES_PATH = ("/api/v0/nodes?detail=1&limit=10000&filter_keys=state&filter_predicates=%3D"
              "&filter_values=ALIVE")
STATUS_PATH = "/api/cluster_status"
#: The label `ray start` gives a node from `RAY_NODE_TYPE_NAME` (ray._raylet.RAY_NODE_GROUP_KEY).
NODE_TYPE_LABEL = "ray.io/node-group"
#: The label Ray gives every host of one TPU slice: the slice is billed once, not per host.
TPU_SLICE_LABEL = "ray.io/tpu-slice-name"
#: A v1 report older than this is a monitor that stopped writing: its nodes are not current.
STALE_REPORT_S = 300.0


def camel(name: str) -> str:
    """A name as Ray's dashboard writes every key of its answers (`to_google_style`), node type
    names included: `gpu_a100` becomes `gpuA100`."""
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def _price(counts: collections.Counter[str], prices: dict[str, float], head_type: str) -> float:
    by_name = {**{camel(name): price for name, price in prices.items()}, **prices}
    if head_type and not counts[head_type] and not counts[camel(head_type)]:
        counts[head_type] = 1
    return sum(by_name.get(name, 0.0) * count for name, count in counts.items())


def report_counts(answer: Any, now: float) -> collections.Counter[str] | None:
    """Nodes by type from `/api/cluster_status` (`data.clusterStatus.autoscalerReport`): active
    and launching (both billed). None without a current report of typed nodes: v2 or no
    autoscaler (no report), a read-only monitor (`legacy`: nodes named by id), or a report older
    than STALE_REPORT_S (`clusterStatus.time`, the head's clock, which the gateway shares)."""
    data = answer.get("data") if isinstance(answer, dict) else None
    status = data.get("clusterStatus") if isinstance(data, dict) else None
    report = status.get("autoscalerReport") if isinstance(status, dict) else None
    if not isinstance(report, dict) or report.get("legacy"):
        return None
    stamp = status.get("time") if isinstance(status, dict) else None
    if isinstance(stamp, (int, float)) and now - stamp > STALE_REPORT_S:
        return None
    counts: collections.Counter[str] = collections.Counter()
    active = report.get("activeNodes")
    for name, count in (active.items() if isinstance(active, dict) else []):
        counts[str(name)] += int(count)
    for node in report.get("pendingNodes") or []:  # [ip, node type, status]
        if isinstance(node, list) and len(node) >= 2:
            counts[str(node[1])] += 1
    return counts


def table_counts(answer: Any, head_type: str) -> collections.Counter[str] | None:
    """Nodes by type from `/api/v0/nodes`: each alive node by its NODE_TYPE_LABEL (the head by
    `is_head_node`, whatever its label), the hosts of one TPU slice once. None without a list."""
    data = answer.get("data") if isinstance(answer, dict) else None
    listing = data.get("result") if isinstance(data, dict) else None
    nodes = listing.get("result") if isinstance(listing, dict) else None
    if not isinstance(nodes, list):
        return None
    seen: set[tuple[str, str]] = set()
    counts: collections.Counter[str] = collections.Counter()
    for node in nodes:
        if not isinstance(node, dict) or node.get("state") != "ALIVE":
            continue
        labels = node.get("labels")
        labels = labels if isinstance(labels, dict) else {}
        kind = head_type if node.get("is_head_node") else str(labels.get(NODE_TYPE_LABEL, ""))
        billed_as = str(labels.get(TPU_SLICE_LABEL) or node.get("node_id"))
        if kind and (kind, billed_as) not in seen:
            seen.add((kind, billed_as))
            counts[kind] += 1
    return counts


def cluster_hourly(status_answer: Any, nodes_answer: Any, prices: dict[str, float],
                   head_type: str, fixed: float, now: float) -> float:
    """The cluster's $/h from the two answers (None: not asked, or no answer), in the order the
    module's docstring gives; `fixed` when neither names the nodes."""
    counts = report_counts(status_answer, now)
    if counts is None:
        counts = table_counts(nodes_answer, head_type)
    return fixed if counts is None else _price(counts, prices, head_type)

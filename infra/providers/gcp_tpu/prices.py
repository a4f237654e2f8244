"""An ESTIMATE of what GCP charges: a small dated table of on-demand prices shipped with rayfleet.

Google publishes prices only through the Cloud Billing Catalog API (another API to enable and
another permission to ask for) and they vary by region, so rayfleet carries the list prices of the
machine and TPU types it knows, in us-central1, as of `AS_OF`. Every figure built from this table is
labelled an estimate wherever it is shown. Spot and preemptible capacity is priced at
`DISCOUNTED_FACTOR` of on-demand, a rough average of Google's 60-91 % discounts. Update the table
(and `AS_OF`) from https://cloud.google.com/compute/vm-instance-pricing and
https://cloud.google.com/tpu/pricing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.core.costs import Cost, CostRange, NodePrices
    from infra.providers.gcp_tpu.spec import Spec

AS_OF = "2026-11-01"
SOURCE = f"estimate: rayfleet's GCP price table of {AS_OF} (us-central1 list prices)"
DISCOUNTED_FACTOR = 0.3

#: On-demand $/h per VM, us-central1.
MACHINE_TYPES: dict[str, float] = {
    "e2-micro": 0.0084, "e2-small": 0.0168, "e2-medium": 0.0335,
    "e2-standard-2": 0.0670, "e2-standard-4": 0.1340, "e2-standard-8": 0.2681,
    "e2-standard-16": 0.5362,
    "n1-standard-1": 0.0475, "n1-standard-2": 0.0950, "n1-standard-4": 0.1900,
    "n1-standard-8": 0.3800, "n1-standard-16": 0.7600,
    "n2-standard-2": 0.0971, "n2-standard-4": 0.1942, "n2-standard-8": 0.3885,
    "n2-standard-16": 0.7769, "n2-standard-32": 1.5539,
    "n2-highmem-2": 0.1310, "n2-highmem-4": 0.2620, "n2-highmem-8": 0.5241,
    "c2-standard-4": 0.2088, "c2-standard-8": 0.4176, "c2-standard-16": 0.8352,
}

#: On-demand $/h per TPU chip, by generation (API name).
TPU_CHIP_HOUR: dict[str, float] = {
    "v2": 1.125, "v3": 2.00, "v4": 3.22, "v5litepod": 1.20, "v5p": 4.20, "v6e": 2.70,
}


def machine_hourly(machine_type: str, provisioning: str = "standard") -> float | None:
    """$/h of one VM of `machine_type` (a name or a URL ending in it); None if not in the table."""
    price = MACHINE_TYPES.get(machine_type.rsplit("/", 1)[-1])
    if price is None:
        return None
    return price * (DISCOUNTED_FACTOR if provisioning in ("spot", "preemptible") else 1.0)


def tpu_hourly(accelerator_type: str, chips: int | None = None,
               provisioning: str = "standard") -> float | None:
    """$/h of one TPU slice, e.g. "v4-8" (chips derived from the name when not given)."""
    generation, _, size = accelerator_type.lower().rpartition("-")
    price = TPU_CHIP_HOUR.get(generation)
    if price is None:
        return None
    if chips is None:
        if not size.isdigit():
            return None
        # v2-v4 and v5p count TensorCores (2 per chip); v5e and v6e count chips.
        chips = int(size) // 2 if generation in ("v2", "v3", "v4", "v5p") else int(size)
    return price * chips * (DISCOUNTED_FACTOR if provisioning in ("spot", "preemptible") else 1.0)


def cost_range(spec: Spec) -> CostRange:
    """$/h of the head plus min_workers of each type, and of the largest cluster the spec allows:
    the head plus `max_total` workers (max_workers caps the sum of the types' maxima), the most
    expensive types filling the slots above the minimum, so the maximum is one reachable size."""
    from infra.core.costs import CostRange

    head = machine_hourly(spec.head.machine_type)
    pools: list[tuple[float | None, int, int]] = []
    for cpu in spec.cpu_workers.values():
        pools.append((machine_hourly(cpu.machine_type, cpu.provisioning), cpu.min_workers,
                      cpu.max_workers))
    for t in spec.tpu_workers.values():
        shape = t.slice
        pools.append((tpu_hourly(shape.accelerator_type, shape.chips, t.provisioning),
                      t.min_workers, t.max_workers))
    low_nodes = 1 + sum(least for _, least, _ in pools)
    high_nodes = 1 + spec.max_total
    if head is None or any(price is None for price, _, _ in pools):
        return CostRange(low_nodes, high_nodes, None, None,
                         f"{SOURCE}; a machine or TPU type is not in the table")
    low = head + sum((price or 0.0) * least for price, least, _ in pools)
    high, slots = low, spec.max_total - (low_nodes - 1)
    for price, least, most in sorted(pools, key=lambda pool: -(pool[0] or 0.0)):
        extra = min(most - least, slots)
        high, slots = high + (price or 0.0) * extra, slots - extra
    return CostRange(low_nodes, high_nodes, low, high, SOURCE)


def node_prices(spec: Spec) -> NodePrices | None:
    """$/h of each node type of the rendered Ray config (`head` and the spec's worker type names),
    for the sharing gateway's cost share; None when a type is not in the table."""
    from infra.core.costs import NodePrices

    by_type: dict[str, float | None] = {"head": machine_hourly(spec.head.machine_type)}
    for name, cpu in spec.cpu_workers.items():
        by_type[name] = machine_hourly(cpu.machine_type, cpu.provisioning)
    for name, tpu in spec.tpu_workers.items():
        by_type[name] = tpu_hourly(tpu.slice.accelerator_type, tpu.slice.chips, tpu.provisioning)
    floor = cost_range(spec).min_hourly_usd
    if floor is None or any(price is None for price in by_type.values()):
        return None
    return NodePrices("head", {name: price or 0.0 for name, price in by_type.items()}, floor)


def current_cost(vms: list[dict[str, Any]], tpu_nodes: list[dict[str, Any]]) -> Cost:
    """Nodes, estimated $/h now, uptime and accrued cost of a cluster's listed VMs and TPU nodes."""
    import datetime as dt

    from infra.core.costs import Cost

    now = dt.datetime.now(dt.timezone.utc)

    def age(resource: dict[str, Any]) -> float:
        stamp = resource.get("creationTimestamp") or resource.get("createTime")
        try:
            return max(0.0, (now - dt.datetime.fromisoformat(str(stamp))).total_seconds())
        except ValueError:
            return 0.0

    def kind(scheduling: dict[str, Any], spot: bool) -> str:
        return "spot" if spot else ("preemptible" if scheduling.get("preemptible") else "standard")

    # (resource, its $/h or None when the table lacks its type) for every billed resource
    priced: list[tuple[dict[str, Any], float | None]] = []
    for vm in vms:
        labels = vm.get("labels") or {}
        if "tpu_cores" in labels or vm.get("status") in ("TERMINATED", "STOPPED", "SUSPENDED"):
            continue  # a TPU VM's own instance (priced with its node), or not billed for its CPUs
        scheduling = vm.get("scheduling") or {}
        spot = scheduling.get("provisioningModel") == "SPOT"
        priced.append((vm, machine_hourly(str(vm.get("machineType", "")), kind(scheduling, spot))))
    for node in tpu_nodes:
        if node.get("state") not in ("READY", "CREATING", "RESTARTING", "REPAIRING"):
            continue
        scheduling = node.get("schedulingConfig") or {}
        priced.append((node, tpu_hourly(str(node.get("acceleratorType", "")), None,
                                        kind(scheduling, bool(scheduling.get("spot"))))))
    nodes = len(priced)
    uptime = max((age(resource) for resource, _ in priced), default=0.0)
    unknown = any(price is None for _, price in priced)
    hourly = sum(price for _, price in priced if price is not None)
    accrued = sum(price * age(resource) / 3600 for resource, price in priced if price is not None)
    if unknown:
        return Cost(nodes, None, uptime or None, None,
                    source=f"{SOURCE}; a machine or TPU type is not in the table")
    return Cost(nodes, round(hourly, 4), uptime or None, round(accrued, 4), source=SOURCE)

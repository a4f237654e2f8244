"""What the `lambda` provider's `plan` works out without creating anything: where the nodes would
go given Lambda's capacity now, what each resource costs, the rendered Ray configs, and the cost
range at minimum and maximum size. provider.py holds the verb; this module its parts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.core import render
from infra.core.costs import CostRange
from infra.core.errors import RayfleetError
from infra.core.state import State
from infra.node import identity
from infra.node.lambda_cloud import api
from infra.providers.base import PlannedResource
from infra.providers.lambda_cloud import autoscale, costs, firewall, fleet, raycluster
from infra.providers.lambda_cloud.records import Firewall, Instance, SshKey
from infra.providers.lambda_cloud.spec import Choice, Spec


def place(spec: Spec, types: dict[str, api.InstanceType]) -> tuple[Choice | None, Choice | None]:
    """Where `up` would put the head and the workers given a capacity view (same region)."""
    def has(choice: Choice) -> bool:
        info = types.get(choice.instance_type)
        return bool(info and choice.region in info.regions_with_capacity)

    for head in spec.head.choices:
        if not has(head):
            continue
        needed = spec.worker_choices(needed_now=True)
        worker = next((c for c in spec.worker_choices() if c.region == head.region and has(c)), None)
        if worker or not needed:
            return head, worker
    return None, None


@dataclass(frozen=True)
class Capacity:
    """What `plan` hands `up` and `cost_range` (`Plan.extra`): Lambda's instance types as listed."""

    #: Instance types by name (prices, regions with capacity); None without a key or on an error.
    types: dict[str, api.InstanceType] | None = None
    #: `time.monotonic()` of the listing: `up` launches from it while it is fresher than the
    #: account's launch interval, instead of asking again.
    fetched_at: float = 0.0

    def fresh(self, max_age_s: float) -> dict[str, api.InstanceType] | None:
        return self.types if time.monotonic() - self.fetched_at < max_age_s else None


def listing(client: Callable[[], api.LambdaClient]) -> tuple[Capacity, list[str]]:
    """Lambda's instance types now, and the plan's problems: `up` cannot start without the API,
    so a plan that could not reach it has failed."""
    if api.read_api_key() is None:
        return Capacity(), ["capacity and prices unknown: no Lambda API key (set LAMBDA_API_KEY "
                            f"or put `api_key = ...` in ~/{api.LAMBDA_KEYS_FILE})"]
    try:
        types = client().instance_types()
    except RayfleetError as exc:
        return Capacity(), [f"capacity and prices unknown: {exc}"]
    return Capacity(types, time.monotonic()), []


def instance_rows(spec: Spec, state: State | None, slots: list[fleet.Slot],
                  types: dict[str, api.InstanceType] | None) -> tuple[list[PlannedResource], int]:
    """One row per instance slot (what exists, or where it would go) and the cents per hour."""
    existing = {fleet.slot_key(r.attrs.name, r.attrs): r
                for r in (state.resources(Instance) if state else [])}
    head_choice, worker_choice = place(spec, types) if types else (None, None)
    resources, hourly = [], 0
    for slot in slots:
        if slot.key in existing:
            attrs = existing[slot.key].attrs
            resources.append(PlannedResource(
                "Lambda instance", slot.name, f"{existing[slot.key].id}: {attrs.instance_type} "
                f"in {attrs.region}, {attrs.ip or 'no IP yet'}", exists=True))
            hourly += attrs.price_cents_per_hour or 0
            continue
        choice = head_choice if slot.role == "head" else worker_choice
        if choice is not None and types:
            price = types[choice.instance_type].price_cents_per_hour
            hourly += price
            detail = (f"{choice.instance_type} in {choice.region}, "
                      f"{costs.usd_from_cents(price)}/h (capacity now)")
        else:
            pool = spec.head.choices if slot.role == "head" else spec.worker_choices()
            detail = "first with capacity of " + ", ".join(str(c) for c in pool)
            if types:
                detail = "NO CAPACITY NOW in any of " + ", ".join(str(c) for c in pool)
        resources.append(PlannedResource("Lambda instance", slot.name, detail))
    return resources, hourly


def access_rows(spec: Spec, state: State | None, key_path: Path, notes: list[str]
                ) -> tuple[list[PlannedResource], list[PlannedResource]]:
    """(the SSH key's row, listed first; the firewall ruleset's and the autoscaled workers'
    rows), and what to note about them in `notes`."""
    keys, rows = [], []
    if spec.ssh_key_name:
        notes.append(f"instances use the account's SSH key {spec.ssh_key_name!r}; `ray up` "
                     f"copies {spec.ssh_private_key} to the head as ~/ray_bootstrap_key.pem")
    else:
        keys.append(PlannedResource(
            "Lambda SSH key", f"rayfleet-{spec.name}-{identity.ID_PLACEHOLDER}-<fingerprint>",
            f"public half of {key_path} (generated here, 0600; the private key stays "
            "here and on the head)", exists=bool(state and state.resources(SshKey))))
    ruleset = firewall.ruleset_name(spec.name, state.cluster_id if state else identity.ID_PLACEHOLDER)
    sources = ", ".join(spec.ssh_source_ranges or ["anywhere"])
    gateway = firewall.gateway_of(spec)
    change = firewall.pending_change(state, spec.ssh_source_ranges, gateway)
    opened = f"; sharing gateway {firewall.describe_gateway(gateway)}" if gateway else ""
    rows.append(PlannedResource(
        "Lambda firewall ruleset", ruleset, f"SSH from {sources}{opened}; no Ray port"
        + (f" (changes at `up`: {change})" if change else ""),
        exists=bool(state and state.resources(Firewall))))
    for region in firewall.unfiltered([c.region for _, c in spec.all_choices()]):
        notes.append(f"{region} (accepted by accept_open_regions): Lambda applies no firewall "
                     f"rules there; nodes placed in {region} are open on every port")
    for name, kind in (spec.worker_types or {}).items() if spec.autoscaling else ():
        rows.append(PlannedResource(
            "Lambda instances (autoscaled)", f"{spec.name}-<id>-{name}-*",
            f"{kind.min_workers}..{kind.max_workers} x first with capacity of "
            + ", ".join(str(c) for c in kind.choices) + "; launched by Ray's autoscaler "
            f"on demand, terminated after {spec.idle_timeout_minutes:g} idle min"))
    return keys, rows


def cost_notes(spec: Spec, types: dict[str, api.InstanceType], hourly: int,
               instances: int) -> list[str]:
    """What each choice costs now, and the estimate for the cluster."""
    notes = capacity_notes(spec, types)
    cost = autoscale.hourly_range(spec, types)
    if spec.autoscaling and cost:
        notes.append(f"estimated cost: {costs.usd_from_cents(cost[0])}/h at minimum size, "
                     f"{costs.usd_from_cents(cost[1])}/h at maximum size (first choices' prices)")
    else:
        notes.append(f"estimated cost: {costs.usd_from_cents(hourly)}/h for {instances} instance(s)")
    return notes


def capacity_notes(spec: Spec, types: dict[str, api.InstanceType]) -> list[str]:
    lines = []
    for role, choices in (("head", spec.head.choices), ("workers", spec.worker_choices())):
        parts = []
        for choice in choices:
            info = types.get(choice.instance_type)
            if info is None:
                parts.append(f"{choice} (unknown type)")
                continue
            mark = "capacity" if choice.region in info.regions_with_capacity else "none"
            parts.append(f"{choice} {costs.usd_from_cents(info.price_cents_per_hour)}/h: {mark}")
        if parts:
            lines.append(f"{role} choices now: " + "; ".join(parts))
    return lines


def render_autoscaler(spec: Spec, state: State | None, head: api.Instance | None,
                      types: dict[str, api.InstanceType] | None, scale: float) -> str:
    """The autoscaler config; before the head exists, with the first head choice's region. With
    no `head` given (`plan`), the head the state records, so that plan renders for a running
    cluster what `up` rendered and its diff shows only what changed."""
    key = next((r.attrs.name for r in (state.resources(SshKey) if state else [])),
               f"rayfleet-{spec.name}-{identity.ID_PLACEHOLDER}-<fingerprint>")
    head = head or _recorded_head(state)
    region = head.region if head and head.region else spec.head.choices[0].region
    rulesets = [r.id for r in (state.resources(Firewall) if state else [])
                if r.attrs.region == region] or ["<ruleset id>"]
    text = autoscale.render_config(spec, state.cluster_id if state else identity.ID_PLACEHOLDER,
                                   state.owner if state else "<owner>", region, key, rulesets,
                                   types, scale, raycluster.private_address(head) if head else None)
    # Ray's defaults for external providers bring empty legacy keys it then warns about.
    logging.getLogger("ray.autoscaler._private.util").setLevel(logging.ERROR)
    render.validate_ray_cluster_config(text, f"autoscaler config for {spec.name}")
    return text


def _recorded_head(state: State | None) -> api.Instance | None:
    """The head as the state last saw it (its slot, region and addresses), or None."""
    for r in state.resources(Instance) if state else []:
        attrs = r.attrs
        if fleet.slot_key(attrs.name, attrs) == "head" and attrs.ip:
            return api.Instance(
                id=r.id, name=attrs.name, status=attrs.status or "", ip=attrs.ip,
                private_ip=attrs.private_ip or None, type_name=attrs.instance_type or "",
                region=attrs.region or "", price_cents_per_hour=attrs.price_cents_per_hour or 0)
    return None


def render_fixed(spec: Spec, state: State | None, slots: list[fleet.Slot], key_path: Path,
                 nodes: dict[str, api.Instance] | None = None) -> str:
    """The Ray config: real addresses when known, else placeholders that say so."""
    ips: dict[str, str] = {}
    private: dict[str, str] = {}
    for r in state.resources(Instance) if state else []:
        key = fleet.slot_key(r.attrs.name, r.attrs)
        if r.attrs.ip and key:
            ips[key] = r.attrs.ip
            private[key] = r.attrs.private_ip or r.attrs.ip
    for key, inst in (nodes or {}).items():
        ips[key] = str(inst.ip)
        private[key] = raycluster.private_address(inst)
    head = ips.get(slots[0].key, "HEAD_IP_AFTER_LAUNCH")
    workers = [ips.get(s.key, f"WORKER_{s.index}_IP_AFTER_LAUNCH") for s in slots[1:]]
    text = raycluster.render_config(spec, head, workers, key_path,
                                    state.cluster_id if state is not None else identity.ID_PLACEHOLDER,
                                    private.get(slots[0].key))
    render.validate_ray_cluster_config(text, f"templates/lambda.yaml.j2 for {spec.name}")
    return text


def cost_range(spec: Spec, types: dict[str, api.InstanceType]) -> CostRange | None:
    """$/h at min and max size from Lambda's prices (the head's and each type's first choice)."""
    workers = list((spec.worker_types or {}).values())
    if spec.autoscaling:
        cents = autoscale.hourly_range(spec, types)
        low_nodes = 1 + sum(k.min_workers for k in workers)
        high_nodes = 1 + sum(k.max_workers for k in workers)
    else:
        head = types.get(spec.head.choices[0].instance_type)
        worker = (types.get(spec.workers.choices[0].instance_type)
                  if spec.workers.choices else None)
        count = spec.workers.count
        cents = None if head is None else (
            head.price_cents_per_hour + count * (worker.price_cents_per_hour if worker else 0),) * 2
        low_nodes = high_nodes = 1 + count
    if cents is None:
        return None
    return CostRange(low_nodes, high_nodes, cents[0] / 100, cents[1] / 100, costs.SOURCE)

"""The cluster's own firewall ruleset: SSH from the spec's `ssh_source_ranges` and, with `sharing:`,
the gateway's TLS port from `sharing.allowed_source_ranges`; nothing else.

Lambda rulesets are per region and attached at launch (`firewall_rulesets`); instances of a
cluster all run in the head's region, so a cluster has one ruleset, created just before its first
launch in that region. Its name, `rayfleet-<cluster>-<cluster id>`, is the proof of ownership
(rulesets have no tags): a colleague's ruleset never carries our random id and is never touched.
Ray's ports (GCS, dashboard, client server) are never opened: the nodes talk over their private
addresses and we reach the dashboard through an SSH tunnel (see NOTES.md for what Lambda
documents about traffic between instances).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from infra.core import ui
from infra.core.spec import ClusterSpec
from infra.core.state import State
from infra.node import wait
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud.records import Firewall

ANYWHERE = "0.0.0.0/0"
#: "Firewall rules do not apply to the us-south-1 region" (Lambda's API description, 1.8.3, on
#: /firewall-rules): nodes there are reachable on every port from anywhere.
UNFILTERED_REGIONS = frozenset({"us-south-1"})


def ruleset_name(cluster: str, cluster_id: str) -> str:
    return f"rayfleet-{cluster}-{cluster_id}"


#: The sharing gateway's opening: (its TLS port, the networks allowed to reach it).
Gateway = tuple[int, list[str]]


def gateway_of(spec: ClusterSpec) -> Gateway | None:
    """The spec's `sharing:` as an opening (None without sharing)."""
    sharing = spec.sharing
    return (sharing.port, list(sharing.allowed_source_ranges)) if sharing is not None else None


def rules(source_ranges: list[str] | None, gateway: Gateway | None = None) -> list[dict[str, object]]:
    """SSH from `source_ranges` (anywhere when unset), and the gateway's port, tcp only, from each
    of its ranges (validation refuses `sharing:` without them on Lambda: never from anywhere)."""
    ranges = source_ranges if source_ranges else [ANYWHERE]
    out: list[dict[str, object]] = [
        {"protocol": "tcp", "port_range": [22, 22], "source_network": cidr,
         "description": "rayfleet: SSH (Ray's ports stay closed; use the SSH tunnel)"}
        for cidr in ranges]
    if gateway is not None:
        port, allowed = gateway
        out += [{"protocol": "tcp", "port_range": [port, port], "source_network": cidr,
                 "description": "rayfleet: the sharing gateway (TLS, members' own tokens)"}
                for cidr in allowed]
    return out


def unfiltered(regions: list[str]) -> list[str]:
    """Those of `regions` where Lambda applies no firewall rule."""
    return sorted(set(regions) & UNFILTERED_REGIONS)


def warn_if_open(source_ranges: list[str] | None, source: str,
                 regions: list[str] | None = None) -> None:
    for region in unfiltered(regions or []):
        ui.warn(f"{source}: {region}: Lambda applies no firewall rules there: a node placed in "
                f"{region} accepts connections on every port from anywhere (accepted by "
                "accept_open_regions)")
    if not source_ranges:
        ui.warn(f"{source}: ssh_source_ranges is not set: the nodes accept SSH (key only) from "
                "anywhere; list your networks, e.g. `ssh_source_ranges: [203.0.113.0/24]`")


def sources(source_ranges: list[str] | None) -> list[str]:
    """The networks the rules open SSH to, as recorded in state (plan compares them)."""
    return [str(r["source_network"]) for r in rules(source_ranges)]


def _normal(rule_list: Any) -> set[tuple[str, tuple[int, ...], str]]:
    import ipaddress

    out = set()
    for rule in rule_list:
        network = str(ipaddress.IPv4Network(str(rule.get("source_network")), strict=False))
        out.add((str(rule.get("protocol")), tuple(rule.get("port_range") or ()), network))
    return out


def _recorded_gateway(attrs: Firewall) -> Gateway | None:
    return (attrs.gateway[0], list(attrs.gateway[1])) if attrs.gateway else None


def describe_gateway(gateway: Gateway | None) -> str:
    return f"port {gateway[0]} from {', '.join(gateway[1])}" if gateway else "closed"


def pending_change(state: State | None, source_ranges: list[str] | None,
                   gateway: Gateway | None = None) -> str | None:
    """What the next `up` changes in the recorded ruleset's rules ("SSH from A -> B", "sharing
    gateway: ... -> ..."), or None."""
    for resource in state.resources(Firewall) if state else []:
        recorded = resource.attrs.sources
        if recorded is None:
            continue
        changes = []
        if _normal(rules(recorded)) != _normal(rules(source_ranges)):
            changes.append(f"SSH from {', '.join(recorded)} -> {', '.join(sources(source_ranges))}")
        was = _recorded_gateway(resource.attrs)
        if (was and _normal(rules(None, was))) != (gateway and _normal(rules(None, gateway))):
            changes.append(f"sharing gateway: {describe_gateway(was)} -> "
                           f"{describe_gateway(gateway)}")
        if changes:
            return "; ".join(changes)
    return None


def ensure(client: api.LambdaClient, state: State, region: str,
           source_ranges: list[str] | None, gateway: Gateway | None = None) -> str:
    """The id of this cluster's ruleset in `region`, created (and recorded) if missing; its
    rules replaced (PATCH) when the spec's source ranges or sharing gateway changed since."""
    for resource in state.resources(Firewall):
        if resource.attrs.region == region:
            try:
                _sync(client, state, resource.id, source_ranges, gateway)
            except api.NotFound:  # deleted outside rayfleet: make a new one
                state.remove(Firewall, resource.id)
                break
            return resource.id
    name = ruleset_name(state.cluster, state.cluster_id)
    existing = _find(client, name, region)
    if existing is None:
        opened = f"SSH, sharing gateway {describe_gateway(gateway)}" if gateway else "SSH only"
        with ui.step(f"creating firewall ruleset {name} in {region} ({opened})"):
            try:
                existing = client.create_firewall_ruleset(name, region,
                                                          rules(source_ranges, gateway))
            except api.LambdaError:
                # The answer may have been lost after the ruleset was made: look before failing.
                existing = _find(client, name, region)
                if existing is None:
                    raise
    state.add(existing.id, Firewall(name=name, region=region, sources=sources(source_ranges),
                                    gateway=gateway or None))
    _sync(client, state, existing.id, source_ranges, gateway, existing)
    return existing.id


def sync_recorded(client: api.LambdaClient, state: State, source_ranges: list[str] | None,
                  gateway: Gateway | None = None) -> None:
    """Apply changed source ranges to every ruleset this cluster has (called at each `up`)."""
    for resource in list(state.resources(Firewall)):
        ensure(client, state, resource.attrs.region, source_ranges, gateway)


def _sync(client: api.LambdaClient, state: State, ruleset_id: str, source_ranges: list[str] | None,
          gateway: Gateway | None = None, current: api.FirewallRuleset | None = None) -> None:
    current = current or client.firewall_ruleset(ruleset_id)
    wanted = rules(source_ranges, gateway)
    if _normal(current.rules) != _normal(wanted):
        with ui.step(f"firewall ruleset {current.name}: SSH now from "
                     f"{', '.join(sources(source_ranges))}, sharing gateway "
                     f"{describe_gateway(gateway)}"):
            client.update_firewall_ruleset(ruleset_id, wanted)
    state.update(Firewall, ruleset_id, sources=sources(source_ranges), gateway=gateway or None)


def _find(client: api.LambdaClient, name: str, region: str) -> api.FirewallRuleset | None:
    return next((r for r in client.firewall_rulesets() if r.name == name and r.region == region),
                None)


def delete(client: api.LambdaClient, state: State, timeout: float = 120) -> None:
    """Delete this cluster's ruleset(s): those in state, and any named with our id (a lost
    answer). Instances must be terminated first; Lambda refuses to delete a ruleset in use."""
    name = ruleset_name(state.cluster, state.cluster_id)
    ids = {r.id for r in state.resources(Firewall)}
    ids |= {r.id for r in client.firewall_rulesets() if r.name == name}
    for ruleset_id in sorted(ids):
        with contextlib.suppress(api.NotFound):
            # Lambda refuses while an instance just terminated still holds the ruleset.
            wait.retry(functools.partial(client.delete_firewall_ruleset, ruleset_id), (api.RulesetInUse,),
                       backoff=lambda _: max(client.limits.routine_interval, 0.05), patience=timeout)
        with contextlib.suppress(KeyError):
            state.remove(Firewall, ruleset_id)
        ui.info(f"deleted firewall ruleset {name} ({ruleset_id})")

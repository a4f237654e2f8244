"""The cluster's own firewall ruleset: SSH from the spec's `ssh_source_ranges`, nothing else.

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
import time

from infra import ui
from infra.node.lambda_cloud import api
from infra.state import State

FIREWALL = "lambda-firewall-ruleset"
ANYWHERE = "0.0.0.0/0"


def ruleset_name(cluster: str, cluster_id: str) -> str:
    return f"rayfleet-{cluster}-{cluster_id}"


def rules(source_ranges: list[str] | None) -> list[dict[str, object]]:
    ranges = source_ranges if source_ranges else [ANYWHERE]
    return [{"protocol": "tcp", "port_range": [22, 22], "source_network": cidr,
             "description": "rayfleet: SSH (Ray's ports stay closed; use the SSH tunnel)"}
            for cidr in ranges]


def warn_if_open(source_ranges: list[str] | None, source: str) -> None:
    if not source_ranges:
        ui.warn(f"{source}: ssh_source_ranges is not set: the nodes accept SSH (key only) from "
                "anywhere; list your networks, e.g. `ssh_source_ranges: [203.0.113.0/24]`")


def ensure(client: api.LambdaClient, state: State, region: str,
           source_ranges: list[str] | None) -> str:
    """The id of this cluster's ruleset in `region`, created (and recorded) if missing."""
    for resource in state.resources(FIREWALL):
        if resource.attrs.get("region") == region:
            return resource.id
    name = ruleset_name(state.cluster, state.cluster_id)
    existing = _find(client, name, region)
    if existing is None:
        with ui.step(f"creating firewall ruleset {name} in {region} (SSH only)"):
            try:
                existing = client.create_firewall_ruleset(name, region, rules(source_ranges))
            except api.LambdaError:
                # The answer may have been lost after the ruleset was made: look before failing.
                existing = _find(client, name, region)
                if existing is None:
                    raise
    state.add(FIREWALL, existing.id, name=name, region=region)
    return existing.id


def _find(client: api.LambdaClient, name: str, region: str) -> api.FirewallRuleset | None:
    return next((r for r in client.firewall_rulesets() if r.name == name and r.region == region),
                None)


def delete(client: api.LambdaClient, state: State, timeout: float = 120) -> None:
    """Delete this cluster's ruleset(s): those in state, and any named with our id (a lost
    answer). Instances must be terminated first; Lambda refuses to delete a ruleset in use."""
    name = ruleset_name(state.cluster, state.cluster_id)
    ids = {r.id for r in state.resources(FIREWALL)}
    ids |= {r.id for r in client.firewall_rulesets() if r.name == name}
    for ruleset_id in sorted(ids):
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.delete_firewall_ruleset(ruleset_id)
            except api.NotFound:
                pass
            except api.RulesetInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(max(client.limits.request_interval, 0.05))
                continue
            break
        with contextlib.suppress(KeyError):
            state.remove(FIREWALL, ruleset_id)
        ui.info(f"deleted firewall ruleset {name} ({ruleset_id})")

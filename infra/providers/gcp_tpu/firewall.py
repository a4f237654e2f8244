"""The cluster's firewall rules, each to the head only and only when the spec asks: the dashboard's
(`dashboard.allowed_source_ranges`) and the sharing gateway's (`sharing:`, its port from
`sharing.allowed_source_ranges`). Created, updated or deleted to match the spec, recorded in state
before the insert call, checked gone at teardown."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infra.node.gcp_tpu.api import Gcp, GcpError
from infra.providers.gcp_tpu import config
from infra.providers.gcp_tpu.records import Firewall

if TYPE_CHECKING:
    from infra.core.state import Resource, State
    from infra.providers.gcp_tpu.records import Firewall
    from infra.providers.gcp_tpu.spec import Spec

#: (operations, what, api) -> None: waits until the operations are done (provider._wait).
Wait = Callable[[list[dict[str, Any]], str, Gcp], None]


def gateway_name(cluster: str) -> str:
    return f"rayfleet-{cluster}-gateway"


def _rule(spec: Spec, name: str, what: str, ranges: list[str], port: int) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"rayfleet: {what} of cluster {spec.name} (invoke teardown removes it)",
        "network": f"projects/{spec.project}/global/networks/{spec.network}",
        "direction": "INGRESS",
        "priority": 1000,
        "sourceRanges": list(ranges),
        "targetTags": [config.head_tag(spec.name)],
        "allowed": [{"IPProtocol": "tcp", "ports": [str(port)]}],
    }


def body(spec: Spec) -> dict[str, Any]:
    """The dashboard's rule."""
    return _rule(spec, config.firewall_name(spec.name), "dashboard",
                 spec.dashboard.allowed_source_ranges, spec.dashboard.port)


def bodies(spec: Spec) -> list[dict[str, Any]]:
    """Every rule the spec asks for (none by default)."""
    wanted = [body(spec)] if spec.dashboard.allowed_source_ranges else []
    if spec.sharing is not None:
        wanted.append(_rule(spec, gateway_name(spec.name), "sharing gateway",
                            spec.sharing.allowed_source_ranges, spec.sharing.port))
    return wanted


def reconcile(api: Gcp, state: State, spec: Spec, wait: Wait) -> None:
    """Create, update or delete the cluster's rules to match the spec."""
    wanted = bodies(spec)
    names = {rule["name"] for rule in wanted}
    for recorded in state.resources(Firewall):
        if recorded.id not in names:
            delete(api, state, recorded, wait)
    for rule in wanted:
        _ensure(api, state, spec, rule, wait)


def _ensure(api: Gcp, state: State, spec: Spec, wanted: dict[str, Any], wait: Wait) -> None:
    name = wanted["name"]
    current = api.get_firewall(name)
    if current is not None and state.find(Firewall, name) is None and (
            current.get("description") != wanted["description"]):
        raise GcpError(f"gcp-tpu: a firewall rule named {name} exists and is not this "
                       "cluster's; rename the spec file (the cluster name) or delete that rule")
    port = int(wanted["allowed"][0]["ports"][0])
    state.add(name, Firewall(project=spec.project, ranges=wanted["sourceRanges"], port=port))
    keys = ("sourceRanges", "targetTags", "allowed")
    if current is None:
        operation = api.insert_firewall(wanted)
    elif any(current.get(k) != wanted[k] for k in keys):
        # Compute marks `name` required for firewalls.patch (annotations.required).
        operation = api.patch_firewall(name, {"name": name, **{k: wanted[k] for k in keys}})
    else:
        return
    wait([operation], f"firewall rule {name} (tcp:{port} from "
                      f"{', '.join(wanted['sourceRanges'])})", api)


def delete(api: Gcp, state: State, rule: Resource[Firewall], wait: Wait) -> None:
    operation = api.delete_firewall(rule.id)
    if operation is not None:
        wait([operation], f"deleting firewall rule {rule.id}", api)
    if api.get_firewall(rule.id) is not None:
        raise GcpError(f"gcp-tpu: firewall rule {rule.id} still exists after deletion; "
                       "run `invoke teardown` again")
    state.remove(Firewall, rule.id)

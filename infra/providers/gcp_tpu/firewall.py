"""The dashboard's firewall rule (only with `dashboard.allowed_source_ranges`): created, updated or
deleted to match the spec, recorded in state before the insert call, checked gone at teardown."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infra.node.gcp_tpu.api import Gcp, GcpError
from infra.providers.gcp_tpu import config

if TYPE_CHECKING:
    from infra.providers.gcp_tpu.spec import Spec
    from infra.state import Resource, State

#: State kind of the rule (provider.FIREWALL).
FIREWALL = "gcp-firewall"
#: (operations, what, api) -> None: waits until the operations are done (provider._wait).
Wait = Callable[[list[dict[str, Any]], str, Gcp], None]


def body(spec: Spec) -> dict[str, Any]:
    return {
        "name": config.firewall_name(spec.name),
        "description": f"rayfleet: dashboard of cluster {spec.name} (invoke teardown removes it)",
        "network": f"projects/{spec.project}/global/networks/{spec.network}",
        "direction": "INGRESS",
        "priority": 1000,
        "sourceRanges": list(spec.dashboard.allowed_source_ranges),
        "targetTags": [config.head_tag(spec.name)],
        "allowed": [{"IPProtocol": "tcp", "ports": [str(spec.dashboard.port)]}],
    }


def reconcile(api: Gcp, state: State, spec: Spec, wait: Wait) -> None:
    """Create, update or delete the dashboard rule to match the spec's source ranges."""
    name = config.firewall_name(spec.name)
    if not spec.dashboard.allowed_source_ranges:
        for rule in state.resources(FIREWALL):
            delete(api, state, rule, wait)
        return
    wanted = body(spec)
    current = api.get_firewall(name)
    if current is not None and state.find(FIREWALL, name) is None and (
            current.get("description") != wanted["description"]):
        raise GcpError(f"gcp-tpu: a firewall rule named {name} exists and is not this "
                       "cluster's; rename the spec file (the cluster name) or delete that rule")
    state.add(FIREWALL, name, project=spec.project, ranges=wanted["sourceRanges"],
              port=spec.dashboard.port)
    keys = ("sourceRanges", "targetTags", "allowed")
    if current is None:
        operation = api.insert_firewall(wanted)
    elif any(current.get(k) != wanted[k] for k in keys):
        # Compute marks `name` required for firewalls.patch (annotations.required).
        operation = api.patch_firewall(name, {"name": name, **{k: wanted[k] for k in keys}})
    else:
        return
    wait([operation], f"firewall rule {name} (tcp:{spec.dashboard.port} from "
                      f"{', '.join(wanted['sourceRanges'])})", api)


def delete(api: Gcp, state: State, rule: Resource, wait: Wait) -> None:
    operation = api.delete_firewall(rule.id)
    if operation is not None:
        wait([operation], f"deleting firewall rule {rule.id}", api)
    if api.get_firewall(rule.id) is not None:
        raise GcpError(f"gcp-tpu: firewall rule {rule.id} still exists after deletion; "
                       "run `invoke teardown` again")
    state.remove(FIREWALL, rule.id)

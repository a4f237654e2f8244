"""TPU queued resources (`projects.locations.queuedResources`, TPU API v2): names, request bodies,
and the few calls both sides need, the laptop at `up`/`status`/`teardown` and the head's joiner.

Imports only our small core modules and api.py (google's client on first call), so it runs on the
head. A request's id carries the cluster id (`rf-<cluster id>-<slice>-<index>-<attempt>`), and the
node it asks for carries the cluster's labels: only requests with both are ever ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from infra.node import identity
from infra.node.gcp_tpu.api import Gcp

#: What state says a request is in; the API's `state.state`.
WAITING = "WAITING_FOR_RESOURCES"
ACTIVE = "ACTIVE"
#: States after which a request gives no TPU any more (the joiner replaces spot ones).
LOST = ("FAILED", "SUSPENDED")
#: States in which a request holds (or is about to hold) billed TPU nodes.
BILLED = ("PROVISIONING", "ACTIVE", "SUSPENDING")

_ID = re.compile(r"^rf-([0-9a-f]{8})-([a-z][a-z0-9-]*)-(\d+)-(\d+)$")


@dataclass(frozen=True)
class SliceRequest:
    """Everything needed to (re)create one queued slice; JSON-able for the head's config."""

    name: str
    accelerator_type: str
    #: (generation config type, topology) when the spec gave a topology, else None.
    config: tuple[str, str] | None
    runtime_version: str
    hosts: int
    chips_per_host: int
    cpus: int
    provisioning: str
    zones: list[str]
    count: int
    reservation: str | None = None
    valid_until_hours: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    network_config: dict[str, Any] = field(default_factory=dict)
    #: `user:public key` line for the nodes' metadata (the head's key to reach the hosts).
    ssh_keys: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SliceRequest:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if values.get("config") is not None:
            values["config"] = tuple(values["config"])
        return cls(**values)


def request_id(cluster_id: str, slice_name: str, index: int, attempt: int) -> str:
    """`rf-<cluster id>-<slice>-<index>-<attempt>`; also the TPU node's id (at most 63 chars)."""
    return f"rf-{cluster_id}-{slice_name}-{index}-{attempt}"


def parse_id(qr_id: str) -> tuple[str, str, int, int] | None:
    """(cluster id, slice, index, attempt) of one of our ids, else None."""
    match = _ID.fullmatch(qr_id)
    if not match:
        return None
    return match.group(1), match.group(2), int(match.group(3)), int(match.group(4))


def short(resource: dict[str, Any]) -> str:
    return str(resource.get("name", "")).rsplit("/", 1)[-1]


def state_of(resource: dict[str, Any]) -> str:
    return str((resource.get("state") or {}).get("state") or "STATE_UNSPECIFIED")


def body(request: SliceRequest, project: str, zone: str, node_id: str) -> dict[str, Any]:
    """The queuedResources.create body for one slice in `zone`."""
    node: dict[str, Any] = {"runtimeVersion": request.runtime_version,
                            "labels": dict(request.labels),
                            "networkConfig": dict(request.network_config),
                            "metadata": {"ssh-keys": request.ssh_keys} if request.ssh_keys else {},
                            "description": f"rayfleet queued slice {request.name}"}
    if request.config is not None:
        node["acceleratorConfig"] = {"type": request.config[0], "topology": request.config[1]}
    else:
        node["acceleratorType"] = request.accelerator_type
    parent = f"projects/{project}/locations/{zone}"
    data: dict[str, Any] = {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": node_id,
                                                  "node": node}]}}
    if request.provisioning == "spot":
        data["spot"] = {}
    elif request.provisioning == "reserved":
        data["reservationName"] = f"{parent}/reservations/{request.reservation}"
    if request.valid_until_hours:
        data["queueingPolicy"] = {"validUntilDuration": f"{round(request.valid_until_hours * 3600)}s"}
    return data


def ours(resource: dict[str, Any], cluster_id: str) -> bool:
    """A queued resource of this cluster: its id carries the cluster id *and* the node it asks for
    carries the cluster label (a look-alike id alone is never enough)."""
    parsed = parse_id(short(resource))
    if parsed is None or parsed[0] != cluster_id:
        return False
    specs = (resource.get("tpu") or {}).get("nodeSpec") or []
    return bool(specs) and all(
        ((s.get("node") or {}).get("labels") or {}).get(identity.TAG_CLUSTER) == cluster_id
        for s in specs)


def node_names(resource: dict[str, Any]) -> list[str]:
    """Full names of the TPU nodes a request asks for."""
    return [f"{s.get('parent')}/nodes/{s.get('nodeId')}"
            for s in (resource.get("tpu") or {}).get("nodeSpec") or []]


# --- calls ----------------------------------------------------------------------------------------

def create(api: Gcp, zone: str, qr_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """Queue a request (the operation Google returns)."""
    return api.create_queued_resource(zone, qr_id, data)


def listed(api: Gcp, zone: str, cluster_id: str) -> list[dict[str, Any]]:
    """This cluster's queued resources in `zone`, in any state."""
    return [r for r in api.queued_resources(zone) if ours(r, cluster_id)]


def get(api: Gcp, name: str) -> dict[str, Any] | None:
    return api.queued_resource(name)


def delete(api: Gcp, name: str) -> dict[str, Any] | None:
    """Delete a request and, with `force`, the TPU nodes it holds; None if already gone or
    already DELETING (autodown, a sweep and teardown may all get there)."""
    return api.delete_queued_resource(name)

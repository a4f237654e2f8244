"""TPU queued resources in the fake (`projects.locations.queuedResources`, v2 and v2alpha1):
create with `queuedResourceId`, get, list with `pageSize`/`pageToken`, delete with `force`.

A request moves on with time, seen at the next TPU call: ACCEPTED -> WAITING_FOR_RESOURCES; after
`queue_wait_s` (and only when machines are free and its zone is not in `queue_held_zones`) ->
PROVISIONING, its node created (CREATING) on booted machines; after `queue_provision_s` -> ACTIVE,
the node READY with the machines' addresses. `queue_fail_zones` make waiting requests FAILED
(no capacity), `validUntilDuration` makes them FAILED when it runs out, and `suspend()` is Google
taking a spot slice back (SUSPENDING, its node deleted, then SUSPENDED; the request stays listed).
Deleting a request that holds nodes needs `force=true` (FAILED_PRECONDITION otherwise).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from tests.gcp_tpu.fake_errors import grpc_error, label_problem

_HOLDS_NODES = ("PROVISIONING", "ACTIVE", "SUSPENDING")


class QueuedApi:
    """Mixed into FakeGcp (with TpuApi), whose state it uses."""

    # Provided by FakeGcp / TpuApi.
    project: str
    lock: Any
    op_polls: int
    tpu_nodes: dict[str, dict[str, Any]]
    accelerator_types: dict[str, list[tuple[str, str, str]]]
    runtime_versions: dict[str, list[str]]
    events: list[tuple[float, str, str]]
    _ids: Any
    machines: Any

    def _queued_init(self) -> None:
        self.queued: dict[str, dict[str, Any]] = {}
        #: Per request: monotonic time it entered its state, machine addresses once booted.
        self._queued_meta: dict[str, dict[str, Any]] = {}
        self.queue_wait_s = 0.0
        self.queue_provision_s = 0.0
        self.queue_held_zones: set[str] = set()
        #: Parts of request ids whose requests wait until a test removes them from here.
        self.queue_held: set[str] = set()
        self.queue_fail_zones: set[str] = set()
        #: Reservations that exist (full names).
        self.reservations: set[str] = set()

    if TYPE_CHECKING:  # provided by TpuApi / FakeGcp (stubs here would shadow them)
        def _tpu_page(self, key: str, items: list[dict[str, Any]],
                      query: dict[str, str]) -> dict[str, Any]:
            raise NotImplementedError

        def _tpu_op(self, parent: str, verb: str, target: str, effect: Any,
                    result: dict[str, Any] | None = None, kind: str = "Node") -> dict[str, Any]:
            raise NotImplementedError

        def _boot(self, name: str, hosts: int, ssh_keys: str,
                  attributes: dict[str, str]) -> list[str] | None:
            raise NotImplementedError

        def _node_ready(self, node: dict[str, Any], zone: str, addresses: list[str]) -> None:
            raise NotImplementedError

        def _drop_tpu(self, full: str) -> None:
            raise NotImplementedError

    # --- the API ----------------------------------------------------------------------------

    def _queued(self, method: str, parent: str, zone: str, name: str | None,
                query: dict[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        if not name and method == "GET":
            items = [q for key, q in sorted(self.queued.items()) if key.startswith(parent + "/")]
            return 200, self._tpu_page("queuedResources", items, query)
        if not name and method == "POST":
            return self._create_queued(parent, zone, query.get("queuedResourceId", ""), body or {})
        full = f"{parent}/queuedResources/{name}"
        resource = self.queued.get(full)
        if resource is None:
            return 404, grpc_error(404, "NOT_FOUND", f"Resource '{full}' was not found")
        if method == "GET":
            return 200, resource
        if method == "DELETE":
            state = resource["state"]["state"]
            force = query.get("force") in ("true", "True", "1")
            if state == "DELETING":
                # Undocumented; the plausible answer of an AIP-style API (NOTES.md).
                return 400, grpc_error(400, "FAILED_PRECONDITION", (
                    f"Queued resource {name} is already being deleted (state DELETING)"))
            if state in _HOLDS_NODES and not force:
                return 400, grpc_error(400, "FAILED_PRECONDITION", (
                    f"Queued resource {name} in state {state} has nodes; delete them first or "
                    "set force to true"))
            resource["state"] = {"state": "DELETING", "stateInitiator": "USER",
                                 "deletingData": {}}

            def remove() -> None:
                self._drop_nodes(full)
                self.queued.pop(full, None)
                self._queued_meta.pop(full, None)
                self.events.append((time.time(), "queued-deleted", str(name)))

            return 200, self._tpu_op(parent, "delete", full, remove, kind="QueuedResource")
        return 400, grpc_error(400, "INVALID_ARGUMENT", f"{method} is not supported here")

    def _create_queued(self, parent: str, zone: str, qr_id: str,
                       body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        full = f"{parent}/queuedResources/{qr_id}"
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", qr_id):
            return 400, grpc_error(400, "INVALID_ARGUMENT", f"Invalid queued resource id '{qr_id}'")
        if full in self.queued:
            return 409, grpc_error(409, "ALREADY_EXISTS", f"Resource '{full}' already exists")
        if sum(1 for k in ("spot", "guaranteed", "bestEffort") if k in body) > 1:
            return 400, grpc_error(400, "INVALID_ARGUMENT", "Only one tier may be set")
        reservation = body.get("reservationName")
        if reservation and reservation not in self.reservations:
            return 400, grpc_error(400, "INVALID_ARGUMENT", f"Reservation {reservation} not found")
        specs = (body.get("tpu") or {}).get("nodeSpec") or []
        if not specs:
            return 400, grpc_error(400, "INVALID_ARGUMENT", "tpu.nodeSpec must not be empty")
        offered = {t: (c, topo) for t, c, topo in self.accelerator_types.get(zone, [])}
        for spec in specs:
            node = spec.get("node") or {}
            if spec.get("parent") != parent:
                return 400, grpc_error(400, "INVALID_ARGUMENT", (
                    f"nodeSpec parent {spec.get('parent')!r} must be {parent!r}"))
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", str(spec.get("nodeId", ""))):
                return 400, grpc_error(400, "INVALID_ARGUMENT",
                                       f"Invalid node id '{spec.get('nodeId')}'")
            if f"{parent}/nodes/{spec['nodeId']}" in self.tpu_nodes:
                return 409, grpc_error(409, "ALREADY_EXISTS",
                                       f"Node {spec['nodeId']} already exists")
            if label_problem(node.get("labels")):
                return 400, grpc_error(400, "INVALID_ARGUMENT", label_problem(node.get("labels")))
            accelerator = node.get("acceleratorType")
            if not accelerator and node.get("acceleratorConfig"):
                wanted = (node["acceleratorConfig"].get("type"),
                          node["acceleratorConfig"].get("topology"))
                accelerator = next((t for t, ct in offered.items() if ct == wanted), None)
            if accelerator not in offered:
                return 400, grpc_error(400, "INVALID_ARGUMENT", (
                    f"Accelerator type {accelerator!r} is not available in zone {zone}"))
            if node.get("runtimeVersion") not in self.runtime_versions.get(zone, []):
                return 400, grpc_error(400, "INVALID_ARGUMENT", (
                    f"Invalid runtime version {node.get('runtimeVersion')!r}"))
            node["acceleratorType"] = accelerator
        resource = {**body, "name": full,
                    "createTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
                    "state": {"state": "ACCEPTED", "stateInitiator": "USER", "acceptedData": {}}}
        self.queued[full] = resource
        self._queued_meta[full] = {"entered": time.monotonic(), "created": time.monotonic(),
                                   "zone": zone, "addresses": {}}
        self.events.append((time.time(), "queued", qr_id))
        return 200, self._tpu_op(parent, "create", full, lambda: None, resource,
                                 kind="QueuedResource")

    # --- time and test controls -------------------------------------------------------------

    def _set_state(self, full: str, state: str, initiator: str = "SERVICE",
                   **data: Any) -> None:
        # QueuedResourceState has a `<state>Data` field for most states, none for
        # WAITING_FOR_RESOURCES (tpu.v2.json): the fake sends only what the schema has.
        self.queued[full]["state"] = {"state": state, "stateInitiator": initiator}
        if state != "WAITING_FOR_RESOURCES":
            self.queued[full]["state"][f"{state.lower()}Data"] = data or {}
        self._queued_meta[full]["entered"] = time.monotonic()
        self.events.append((time.time(), f"queued-{state.lower()}", full.rsplit("/", 1)[-1]))

    def _advance_queued(self) -> None:
        now = time.monotonic()
        for full, resource in list(self.queued.items()):
            meta = self._queued_meta[full]
            state = resource["state"]["state"]
            waited = now - meta["entered"]
            if state == "ACCEPTED":
                self._set_state(full, "WAITING_FOR_RESOURCES")
            elif state == "WAITING_FOR_RESOURCES":
                self._advance_waiting(full, resource, meta, now, waited)
            elif state == "PROVISIONING" and waited >= self.queue_provision_s:
                for spec in resource["tpu"]["nodeSpec"]:
                    node = self.tpu_nodes.get(f"{spec['parent']}/nodes/{spec['nodeId']}")
                    if node is not None:
                        self._node_ready(node, meta["zone"], meta["addresses"][spec["nodeId"]])
                self._set_state(full, "ACTIVE")
            elif state == "SUSPENDING":
                self._set_state(full, "SUSPENDED")

    def _advance_waiting(self, full: str, resource: dict[str, Any], meta: dict[str, Any],
                         now: float, waited: float) -> None:
        from infra.providers.gcp_tpu import tpu as shapes

        policy = resource.get("queueingPolicy") or {}
        valid = str(policy.get("validUntilDuration") or "")
        if valid.endswith("s") and now - meta["created"] > float(valid[:-1]):
            self._set_state(full, "FAILED", error={
                "code": 4, "message": "The queued resource request expired before resources "
                                      "became available (validUntilDuration)"})
            return
        short = full.rsplit("/", 1)[-1]
        if waited < self.queue_wait_s or meta["zone"] in self.queue_held_zones or any(
                part in short for part in self.queue_held):
            return
        if meta["zone"] in self.queue_fail_zones:
            self._set_state(full, "FAILED", error={
                "code": 8, "message": f"There is no more capacity in the zone \"{meta['zone']}\""})
            return
        booted: dict[str, list[str]] = {}
        for spec in resource["tpu"]["nodeSpec"]:
            node = spec["node"]
            accelerator = node["acceleratorType"]
            topology = next((topo for t, _, topo in self.accelerator_types.get(meta["zone"], [])
                             if t == accelerator), "")
            attributes = {"accelerator-type": accelerator, "instance-id": spec["nodeId"],
                          "tpu-env": f"ACCELERATOR_TYPE: '{accelerator}'\nTOPOLOGY: "
                                     f"'{topology}'\nWORKER_ID: '0'\n"}
            addresses = self._boot(spec["nodeId"], shapes.from_accelerator_type(accelerator).hosts,
                                   str((node.get("metadata") or {}).get("ssh-keys", "")),
                                   attributes)
            if addresses is None:  # no machine free: the request keeps waiting, as in a stockout
                for started in booted:
                    self._release(started)
                return
            booted[spec["nodeId"]] = addresses
        meta["addresses"] = booted
        for spec in resource["tpu"]["nodeSpec"]:
            node_full = f"{spec['parent']}/nodes/{spec['nodeId']}"
            self.tpu_nodes[node_full] = {
                **spec["node"], "name": node_full, "state": "CREATING",
                "labels": dict(spec["node"].get("labels") or {}), "health": "HEALTHY",
                "queuedResource": full, "apiVersion": "V2", "id": str(next(self._ids)),
                "createTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
                **({"schedulingConfig": {"spot": True}} if "spot" in resource else {})}
        self._set_state(full, "PROVISIONING")

    def _release(self, node_id: str) -> None:
        if self.machines is not None:
            self.machines.shutdown(node_id)

    def _drop_nodes(self, full: str) -> None:
        resource = self.queued.get(full)
        if resource is None:
            return
        for spec in resource["tpu"]["nodeSpec"]:
            node_full = f"{spec['parent']}/nodes/{spec['nodeId']}"
            if node_full in self.tpu_nodes:
                self._drop_tpu(node_full)

    def suspend(self, qr_id: str) -> None:
        """Google takes a spot slice back: SUSPENDING (its nodes and machines go), then
        SUSPENDED at the next look; the request itself stays listed."""
        with self.lock:
            full = next(k for k in self.queued if k.rsplit("/", 1)[-1] == qr_id)
            assert "spot" in self.queued[full], f"{qr_id} is not a spot request"
            self._drop_nodes(full)
            self._set_state(full, "SUSPENDING")

    def queued_states(self) -> dict[str, tuple[str, str]]:
        """{request id: (zone, state)} of every request, for assertions."""
        with self.lock:
            self._advance_queued()
            return {k.rsplit("/", 1)[-1]: (k.split("/")[3], q["state"]["state"])
                    for k, q in self.queued.items()}

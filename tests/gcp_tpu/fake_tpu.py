"""The Cloud TPU part of the fake (v2 for rayfleet's own calls, v2alpha1 for Ray's provider):
nodes (create with `nodeId`, get, list with `pageSize`/`pageToken`, patch labels, delete),
operations that carry no `done` key while running and a `response` when finished, accelerator
types and runtime versions, capacity errors, and preemption of spot nodes."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.gcp_tpu.fake_errors import grpc_error, label_problem

#: Each API version's own value of the Node `apiVersion` enum, and the values its enum lacks: a node
#: created through v2 (rayfleet's queued resources) is still listed to Ray's v2alpha1 calls, and
#: Google answers every version in that version's own terms (v2alpha1's enum has no `V2`).
NODE_API_VERSION = {"v2": "V2", "v2alpha1": "V2_ALPHA1"}
_UNKNOWN_TO = {"v2alpha1": {"V2"}}


def seen_through(node: dict[str, Any], version: str) -> dict[str, Any]:
    """`node` as answered through API `version`: its apiVersion within that version's enum."""
    if node.get("apiVersion") in _UNKNOWN_TO.get(version, set()):
        return {**node, "apiVersion": NODE_API_VERSION[version]}
    return node


@dataclass
class Operation:
    body: dict[str, Any]
    polls_left: int
    effect: Any  # callable run once when the operation finishes
    error: dict[str, Any] | None = None
    #: The message type of the finished operation's `response` (Node, QueuedResource).
    kind: str = "Node"


class TpuApi:
    """Mixed into FakeGcp, whose state (`tpu_nodes`, `instances`, `operations`...) it uses."""

    # Provided by FakeGcp.
    project: str
    zones: dict[str, str]
    stockout_zones: set[str]
    tpu_stockout_zones: set[str]
    tpu_quota_zones: set[str]
    lock: Any
    page_size: int
    default_page_size: int
    op_polls: int
    op_seconds: float | None
    machines: Any
    tpu_nodes: dict[str, dict[str, Any]]
    instances: dict[tuple[str, str], dict[str, Any]]
    operations: dict[str, Any]
    op_errors: dict[str, dict[str, Any]]
    accelerator_types: dict[str, list[tuple[str, str, str]]]
    runtime_versions: dict[str, list[str]]
    _ids: Any
    #: (time.time(), "create" | "ready" | "deleted" | "preempted", node id), for benches.
    events: list[tuple[float, str, str]]

    def _boot(self, name: str, hosts: int, ssh_keys: str,
              attributes: dict[str, str]) -> list[str] | None:
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by QueuedApi (a stub here would shadow it)
        def _queued(self, method: str, parent: str, zone: str, name: str | None,
                    query: dict[str, str], body: Any) -> tuple[int, dict[str, Any]]: ...

        def _advance_queued(self) -> None: ...

    def add_instance(self, zone: str, name: str, labels: dict[str, str], **kwargs: Any,
                     ) -> dict[str, Any]:
        raise NotImplementedError

    def _finish_later(self, operation: Operation, finish: Any) -> None:
        raise NotImplementedError

    # --- TPU ----------------------------------------------------------------------------------

    def _tpu(self, method: str, path: str, query: dict[str, str], body: Any = None,
             version: str = "v2") -> tuple[int, dict[str, Any]]:
        match = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/(\w+)(?:/(.+))?", path)
        if not match:
            return 404, grpc_error(404, "NOT_FOUND", f"Resource '{path}' was not found")
        project, zone, collection, name = match.groups()
        self._advance_queued()  # queued requests move on with time, seen at the next call
        if project != self.project:
            return 403, grpc_error(403, "PERMISSION_DENIED",
                                   f"Permission 'tpu.nodes.list' denied on 'projects/{project}'")
        if zone not in self.zones:
            return 404, grpc_error(404, "NOT_FOUND", f"Location {zone} is not found or access is "
                                                     "unauthorized.")
        parent = f"projects/{project}/locations/{zone}"
        if collection == "acceleratorTypes" and not name:
            items = [{"name": f"{parent}/acceleratorTypes/{t}", "type": t,
                      "acceleratorConfigs": [{"type": c, "topology": topo}]}
                     for t, c, topo in self.accelerator_types.get(zone, [])]
            return 200, self._tpu_page("acceleratorTypes", items, query)
        if collection == "runtimeVersions" and not name:
            items = [{"name": f"{parent}/runtimeVersions/{v}", "version": v}
                     for v in self.runtime_versions.get(zone, [])]
            return 200, self._tpu_page("runtimeVersions", items, query)
        if collection == "queuedResources":
            return self._queued(method, parent, zone, name, query, body)
        if collection == "nodes":
            if not name and method == "GET":
                items = [seen_through(n, version) for key, n in sorted(self.tpu_nodes.items())
                         if key.startswith(parent)]
                return 200, self._tpu_page("nodes", items, query)
            if not name and method == "POST":
                return self._create_tpu(parent, zone, query.get("nodeId", ""), body or {},
                                        version)
            node = self.tpu_nodes.get(f"{parent}/nodes/{name}")
            if node is None:
                return 404, grpc_error(404, "NOT_FOUND", f"Resource '{parent}/nodes/{name}' was "
                                                         "not found")
            if method == "GET":
                return 200, seen_through(node, version)
            if method == "PATCH":
                if query.get("updateMask") != "labels":
                    return 400, grpc_error(400, "INVALID_ARGUMENT", "Only the labels field of a "
                                                                    "node can be updated here")
                labels = dict((body or {}).get("labels") or {})
                if label_problem(labels):
                    return 400, grpc_error(400, "INVALID_ARGUMENT", label_problem(labels))
                return 200, self._tpu_op(parent, "update", node["name"],
                                         lambda: node.__setitem__("labels", labels), node)
            if method == "DELETE":
                if node["state"] == "DELETING":  # undocumented, as for queued resources
                    return 400, grpc_error(400, "FAILED_PRECONDITION", (
                        f"Node {name} is already being deleted (state DELETING)"))
                node["state"] = "DELETING"
                full = node["name"]

                def remove() -> None:
                    self._drop_tpu(full)

                return 200, self._tpu_op(parent, "delete", full, remove)
        if collection == "operations" and name:
            operation = self.operations.get(f"{parent}/operations/{name}")
            if operation is None:
                return 404, grpc_error(404, "NOT_FOUND", f"Operation {name} not found")
            operation.polls_left -= 1
            if operation.polls_left <= 0 and not operation.body.get("done"):
                operation.body["done"] = True
                if operation.error:
                    operation.body["error"] = operation.error
                else:
                    operation.effect()
                    result = operation.body.pop("_result", None)
                    operation.body["response"] = (
                        {"@type": f"type.googleapis.com/google.cloud.tpu.{version}.{operation.kind}",
                         **result} if result is not None else
                        {"@type": "type.googleapis.com/google.protobuf.Empty"})
            answer = {k: v for k, v in operation.body.items() if k != "_result"}
            if "response" in answer:  # finished by an earlier poll, perhaps through another version
                answer["response"] = seen_through(answer["response"], version)
            return 200, answer
        return 404, grpc_error(404, "NOT_FOUND", f"Resource '{path}' was not found")

    def _drop_tpu(self, full: str) -> None:
        """A TPU node and its hidden Compute instances are gone; so are its machines."""
        self.tpu_nodes.pop(full, None)
        short = full.rsplit("/", 1)[-1]
        self.events.append((time.time(), "deleted", short))
        for key, instance in list(self.instances.items()):
            if instance["labels"].get("tpu_name") == short:
                del self.instances[key]
        if self.machines is not None:
            self.machines.shutdown(short)

    def _create_tpu(self, parent: str, zone: str, node_id: str, body: dict[str, Any],
                    version: str) -> tuple[int, dict[str, Any]]:
        from infra.providers.gcp_tpu import tpu as shapes

        full = f"{parent}/nodes/{node_id}"
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", node_id):
            return 400, grpc_error(400, "INVALID_ARGUMENT", f"Invalid node id '{node_id}'")
        if full in self.tpu_nodes:
            return 409, grpc_error(409, "ALREADY_EXISTS", f"Resource '{full}' already exists")
        if label_problem(body.get("labels")):
            return 400, grpc_error(400, "INVALID_ARGUMENT", label_problem(body.get("labels")))
        offered = {t: (c, topo) for t, c, topo in self.accelerator_types.get(zone, [])}
        accelerator = body.get("acceleratorType")
        if not accelerator and body.get("acceleratorConfig"):
            wanted = (body["acceleratorConfig"].get("type"), body["acceleratorConfig"].get("topology"))
            accelerator = next((t for t, ct in offered.items() if ct == wanted), None)
        if accelerator not in offered:
            return 400, grpc_error(400, "INVALID_ARGUMENT", f"Accelerator type {accelerator!r} is "
                                                            f"not available in zone {zone}")
        if zone in self.tpu_quota_zones:  # no TPU quota there: refused at once, nothing created
            from tests.gcp_tpu.fake_errors import quota_exhausted

            generation = str(accelerator).split("-")[0].upper()
            return 429, quota_exhausted(f"TPU{generation}PerProjectPerZoneForTPUAPI", f"zone {zone}")
        if body.get("runtimeVersion") not in self.runtime_versions.get(zone, []):
            return 400, grpc_error(400, "INVALID_ARGUMENT", "Invalid runtime version "
                                                            f"{body.get('runtimeVersion')!r}")
        hosts = shapes.from_accelerator_type(accelerator).hosts
        labels = dict(body.get("labels") or {})
        keys = str((body.get("metadata") or {}).get("ssh-keys", ""))
        topology = offered[accelerator][1]
        attributes = {"accelerator-type": accelerator, "instance-id": node_id,
                      "tpu-env": f"ACCELERATOR_TYPE: '{accelerator}'\nTOPOLOGY: '{topology}'\n"
                                 f"WORKER_ID: '0'\n"}
        addresses = (None if zone in self.stockout_zones or zone in self.tpu_stockout_zones
                     else self._boot(node_id, hosts, keys, attributes))
        node: dict[str, Any] = {
            **body, "name": full, "acceleratorType": accelerator, "state": "CREATING",
            "labels": labels, "health": "HEALTHY",
            "apiVersion": NODE_API_VERSION[version],  # the Node enum
            "createTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
            "id": str(next(self._ids)),
        }
        if addresses is None:
            operation = self._tpu_op(parent, "create", full, lambda: None)
            self.operations[operation["name"]].error = {
                "code": 8, "message": f"There is no more capacity in the zone \"{zone}\"; you "
                                      "can try in another zone where Cloud TPU Nodes are offered"}
            return 200, operation
        self.tpu_nodes[full] = node
        self.events.append((time.time(), "create", node_id))

        def ready() -> None:
            self._node_ready(node, zone, addresses)

        return 200, self._tpu_op(parent, "create", full, ready, node)

    def _node_ready(self, node: dict[str, Any], zone: str, addresses: list[str]) -> None:
        """A created node is READY on its machines, with a TPU VM's hidden Compute instances."""
        node_id = node["name"].rsplit("/", 1)[-1]
        node["state"] = "READY"
        self.events.append((time.time(), "ready", node_id))
        node["networkEndpoints"] = [
            {"ipAddress": ip, "port": 8470, "accessConfig": {"externalIp": ip}}
            for ip in addresses]
        for h, ip in enumerate(addresses):  # the hidden Compute instances of a TPU VM
            hidden = self.add_instance(zone, f"t1v-n-{node['id']}-w-{h}",
                                       {**node["labels"], "tpu_cores": "8", "tpu_name": node_id},
                                       nat_ip=None, internal_ip=ip)
            hidden["status"] = "RUNNING"

    def preempt(self, short_name: str, *, delete: bool = False) -> None:
        """Google takes a spot TPU node back: PREEMPTED (its machines stop), or gone (404)."""
        with self.lock:
            full = next(k for k in self.tpu_nodes if k.rsplit("/", 1)[-1] == short_name)
            if delete:
                self._drop_tpu(full)
                return
            self.tpu_nodes[full]["state"] = "PREEMPTED"
            self.events.append((time.time(), "preempted", short_name))
            for instance in self.instances.values():
                if instance["labels"].get("tpu_name") == short_name:
                    instance["status"] = "TERMINATED"
        if self.machines is not None:
            self.machines.shutdown(short_name)

    def _tpu_page(self, key: str, items: list[dict[str, Any]],
                  query: dict[str, str]) -> dict[str, Any]:
        size = (min(int(query["pageSize"]) or self.page_size, self.page_size)
                if query.get("pageSize") else self.default_page_size)
        start = int(query.get("pageToken") or "0")
        page: dict[str, Any] = {}
        if items[start:start + size]:
            page[key] = items[start:start + size]
        if start + size < len(items):
            page["nextPageToken"] = str(start + size)
        return page

    def _tpu_op(self, parent: str, verb: str, target: str, effect: Any,
                result: dict[str, Any] | None = None, kind: str = "Node") -> dict[str, Any]:
        name = f"{parent}/operations/operation-{int(time.time() * 1000)}-{next(self._ids):x}"
        # proto3 JSON leaves out `done: false`: a running operation has no `done` key at all.
        body = {"name": name, "metadata": {
            "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
            "createTime": "2026-01-01T00:00:00Z", "target": target, "verb": verb,
            "cancelRequested": False, "apiVersion": "v2"}}
        self.operations[name] = Operation({**body, "_result": result} if result is not None
                                          else body, self.op_polls, effect,
                                          self.op_errors.get(f"{verb}-tpu"), kind)
        self._finish_later(self.operations[name], lambda operation: self._last_poll(name))
        return dict(body)

    def _last_poll(self, name: str) -> None:
        """Google finishes an operation whether anyone polls it or not: as a last poll would."""
        operation = self.operations[name]
        if not operation.body.get("done"):
            operation.polls_left = 1
            self._tpu("GET", name, {})

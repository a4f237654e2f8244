"""A local fake of the Compute Engine v1 and Cloud TPU v2 REST endpoints rayfleet calls.

Faithful where our code depends on it: URL layout of the discovery documents bundled with
google-api-python-client, JSON shapes (Compute `items`/`nextPageToken`/`maxResults`, TPU
`nodes`/`acceleratorTypes`/`runtimeVersions`/`pageToken`), list filters of the form
`(labels.k = v) AND ...`, both error shapes (Compute's `errors[].reason` and the gRPC-style
`status` + `details[]` ErrorInfo), long-running operations that stay PENDING/RUNNING for
`op_polls` polls before their effect shows (or, with `op_seconds`, until that much time has
passed, whether anyone polls or not: a VM deleting itself never polls), TPU VMs' hidden Compute
instances (label `tpu_cores`, not deletable), and injectable failures (403 API disabled, 404,
429, quota exceeded), also after the request took effect (a lost answer; `requestId` makes the
retry the same request). Every request and answer is held to Google's discovery documents
(fake_answer.py, discovery.py); a violation fails the test that caused it (conftest).

It listens on 127.0.0.1 only and records every request, headers included, so tests can assert
that no credentials were ever sent.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from tests.gcp_tpu.fake_answer import Answering
from tests.gcp_tpu.fake_errors import (
    compute_error,
    grpc_error,
    label_problem,
    rate_limited,
    service_disabled,
)
from tests.gcp_tpu.fake_filter import FilterError, matches
from tests.gcp_tpu.fake_queued import QueuedApi
from tests.gcp_tpu.fake_quota import QuotaApi
from tests.gcp_tpu.fake_tpu import Operation, TpuApi

COMPUTE = "https://www.googleapis.com/compute/v1"
#: httpErrorStatusCode of a failed Compute operation by its error code. Google documents the field
#: (the HTTP status the call would have had) but no table: these follow the codes' meaning, as
#: seen in public reports (quota 403, a stockout 503, a missing resource 404); others 400.
OP_ERROR_STATUS = {"QUOTA_EXCEEDED": 403, "ZONE_RESOURCE_POOL_EXHAUSTED": 503,
                   "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": 503, "RESOURCE_NOT_FOUND": 404,
                   "RESOURCE_ALREADY_EXISTS": 409, "PERMISSIONS_ERROR": 403}
#: Fakes whose contract violations the tests' autouse check still has to look at.
LIVE: list[FakeGcp] = []

__all__ = ["FakeGcp", "compute_error", "grpc_error", "rate_limited", "service_disabled"]


@dataclass
class Failure:
    """An injected answer for requests matching `method` and `path` (regex), `times` times."""

    method: str
    path: str
    status: int
    body: dict[str, Any]
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    #: The request takes effect and only then fails (a reply lost on the way back).
    after: bool = False


class Machines(Protocol):
    """Where the fake's VMs and TPU hosts really run (tests/gcp_tpu/offline.py: test-bed hosts).

    Without one, the fake hands out made-up addresses (unit tests that never SSH anywhere).
    """

    def boot(self, name: str, hosts: int, ssh_keys: str,
             attributes: dict[str, str]) -> list[str] | None:
        """Start `hosts` machines for node `name`; their IPs, or None when none is free."""

    def shutdown(self, name: str) -> None:
        """The node's machines go away (deleted or preempted): their processes end."""


def label_fingerprint(labels: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).digest()
    return base64.b64encode(digest[:8]).decode()


class FakeGcp(Answering, QueuedApi, TpuApi, QuotaApi):
    """The fake's state, editable by tests (as `ray up` would change the real project)."""

    def __init__(self, project: str = "test-project", op_polls: int = 2, page_size: int = 2,
                 op_seconds: float | None = None, default_page_size: int | None = None) -> None:
        self.project = project
        self.op_polls = op_polls
        #: Google finishes an operation by itself, polled or not; None: only polls finish it.
        self.op_seconds = op_seconds
        #: Largest page the fake sends; pages are small so that every caller's paging runs.
        self.page_size = page_size
        #: Page size for a list without maxResults/pageSize (Compute documents 500); None: the
        #: small `page_size` too.
        self.default_page_size = default_page_size or page_size
        self.lock = threading.RLock()
        self.requests: list[dict[str, Any]] = []
        self.failures: list[Failure] = []
        self.disabled: set[str] = set()
        self.ignore_filter = False
        #: Operation errors by operation type, e.g. {"insert-firewall": {...}}.
        self.op_errors: dict[str, dict[str, Any]] = {}
        self.project_quotas = [{"metric": "FIREWALLS", "limit": 200.0, "usage": 12.0}]
        self.zones = {"us-central2-b": "us-central2", "us-central1-a": "us-central1"}
        self.zone_status: dict[str, str] = {}
        #: Zones out of capacity: VM inserts and TPU creates there fail with a stockout.
        self.stockout_zones: set[str] = set()
        #: Zones out of TPU capacity only (TPU creates fail there, VMs are fine).
        self.tpu_stockout_zones: set[str] = set()
        self.regions: dict[str, list[dict[str, Any]]] = {
            region: [{"metric": "CPUS", "limit": 72.0, "usage": 0.0},
                     {"metric": "N2_CPUS", "limit": 48.0, "usage": 0.0},
                     {"metric": "PREEMPTIBLE_CPUS", "limit": 0.0, "usage": 0.0},
                     {"metric": "IN_USE_ADDRESSES", "limit": 8.0, "usage": 0.0}]
            for region in set(self.zones.values())}
        self.machine_types = {"e2-standard-2": 2, "n2-standard-4": 4, "n2-standard-8": 8,
                              "n2-highmem-16": 16}
        self.networks = {"default"}
        self.accelerator_types: dict[str, list[tuple[str, str, str]]] = {
            "us-central2-b": [("v4-8", "V4", "2x2x1"), ("v4-16", "V4", "2x2x2"),
                              ("v4-32", "V4", "2x2x4")],
            "us-central1-a": [("v2-8", "V2", "2x2"), ("v3-8", "V3", "2x2"),
                              ("v5litepod-1", "V5LITE_POD", "1x1"),
                              ("v5litepod-4", "V5LITE_POD", "2x2"),
                              ("v5litepod-8", "V5LITE_POD", "2x4"),
                              ("v5p-8", "V5P", "2x2x1"), ("v6e-8", "V6E", "2x4")],
        }
        self.runtime_versions = {
            "us-central2-b": ["tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-tf-2.16.1-pjrt"],
            "us-central1-a": ["tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite", "v2-alpha-tpuv5",
                              "v2-alpha-tpuv6e"],
        }
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.tpu_nodes: dict[str, dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, Operation] = {}
        self._ids = itertools.count(1000)
        self._server: ThreadingHTTPServer | None = None
        #: Real machines behind created nodes (None: made-up addresses).
        self.machines: Machines | None = None
        self.events: list[tuple[float, str, str]] = []
        self._addresses = itertools.count(20)
        #: Requests and answers the discovery documents reject (tests/gcp_tpu/discovery.py); the
        #: autouse check in conftest fails the test that caused any.
        self.violations: list[str] = []
        self.stopped = False
        #: requestId -> the operation it started.
        self.by_request_id: dict[str, str] = {}
        self._queued_init()
        self._quota_init()
        LIVE.append(self)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeGcp:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                fake._dispatch(self)

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # --- helpers for tests (what Ray's autoscaler would do to the project) --------------------

    def fail(self, method: str, path: str, status: int, body: dict[str, Any], times: int = 1,
             headers: dict[str, str] | None = None, after: bool = False) -> None:
        self.failures.append(Failure(method, path, status, body, times, headers or {}, after))

    def add_instance(self, zone: str, name: str, labels: dict[str, str], *, status: str = "RUNNING",
                     nat_ip: str | None = "127.0.0.1", internal_ip: str = "10.128.0.2",
                     machine_type: str = "n2-standard-4") -> dict[str, Any]:
        interface: dict[str, Any] = {"network": f"{COMPUTE}/projects/{self.project}/global/networks/"
                                                "default", "networkIP": internal_ip}
        if nat_ip:
            interface["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT",
                                           "natIP": nat_ip}]
        instance = {
            "kind": "compute#instance", "id": str(next(self._ids)), "name": name,
            "zone": f"{COMPUTE}/projects/{self.project}/zones/{zone}",
            "machineType": f"{COMPUTE}/projects/{self.project}/zones/{zone}/machineTypes/"
                           f"{machine_type}",
            "status": status, "labels": dict(labels), "labelFingerprint": "42WmSpB8rSM=",
            "networkInterfaces": [interface],
            "selfLink": f"{COMPUTE}/projects/{self.project}/zones/{zone}/instances/{name}",
        }
        with self.lock:
            self.instances[(zone, name)] = instance
        return instance

    def add_tpu_node(self, zone: str, name: str, accelerator_type: str, labels: dict[str, str], *,
                     hosts: int = 1, state: str = "READY") -> dict[str, Any]:
        full = f"projects/{self.project}/locations/{zone}/nodes/{name}"
        node = {
            "name": full, "acceleratorType": accelerator_type, "state": state,
            "runtimeVersion": "tpu-ubuntu2204-base", "labels": dict(labels), "health": "HEALTHY",
            "networkEndpoints": [{"ipAddress": f"10.130.0.{10 + h}", "port": 8470,
                                  "accessConfig": {"externalIp": f"127.0.0.{10 + h}"}}
                                 for h in range(hosts)],
            "createTime": "2026-01-01T00:00:00Z", "apiVersion": "V2",
        }
        with self.lock:
            self.tpu_nodes[full] = node
            for h in range(hosts):  # the hidden Compute instances behind a TPU VM
                self.add_instance(zone, f"t1v-n-{abs(hash(full)) % 10**8:08x}-w-{h}",
                                  {**labels, "tpu_cores": "8", "tpu_name": name}, nat_ip=None)
        return node

    def nodes_with(self, labels: dict[str, str]) -> list[str]:
        """Names of instances and TPU nodes carrying `labels` (what a sweep must leave empty)."""
        with self.lock:
            names = [i["name"] for i in self.instances.values()
                     if all(i["labels"].get(k) == v for k, v in labels.items())]
            names += [n["name"].rsplit("/", 1)[-1] for n in self.tpu_nodes.values()
                      if all(n["labels"].get(k) == v for k, v in labels.items())]
        return names

    def calls(self, method: str, path_part: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method and path_part in r["path"]]

    # --- dispatch -----------------------------------------------------------------------------

    def _dispatch(self, handler: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(parsed.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        method = handler.command
        with self.lock:
            self.requests.append({"method": method, "path": parsed.path, "query": query,
                                  "body": body, "headers": dict(handler.headers.items())})
            status, payload, headers = self._answer(method, parsed.path, query, body)
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json; charset=UTF-8")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    # --- Compute ------------------------------------------------------------------------------

    def _not_found(self, what: str) -> tuple[int, dict[str, Any]]:
        return 404, compute_error(404, "notFound", f"The resource '{what}' was not found")

    def _compute(self, method: str, path: str, query: dict[str, str],
                 body: Any) -> tuple[int, dict[str, Any]]:
        parts = path.split("/")
        if parts[:1] != ["projects"] or len(parts) < 2:
            return self._not_found(path)
        if parts[1] != self.project:
            return self._not_found(f"projects/{parts[1]}")
        rest, project_path = parts[2:], f"projects/{self.project}"
        if not rest and method == "GET":
            return 200, {"kind": "compute#project", "name": self.project, "id": "123456789",
                         "quotas": self.project_quotas, "commonInstanceMetadata": {"items": []}}
        if rest[:1] == ["zones"] and len(rest) >= 2:
            zone = rest[1]
            if zone not in self.zones:
                return self._not_found(f"{project_path}/zones/{zone}")
            return self._zonal(method, zone, rest[2:], query, body)
        if rest[:1] == ["regions"] and len(rest) == 2:
            if rest[1] not in self.regions:
                return self._not_found(f"{project_path}/regions/{rest[1]}")
            return 200, {"kind": "compute#region", "name": rest[1], "status": "UP",
                         "quotas": self.regions[rest[1]]}
        if rest[:2] == ["global", "networks"] and len(rest) == 3:
            if rest[2] not in self.networks:
                return self._not_found(f"{project_path}/global/networks/{rest[2]}")
            return 200, {"kind": "compute#network", "name": rest[2], "autoCreateSubnetworks": True}
        if rest[:2] == ["global", "firewalls"]:
            return self._firewalls(method, rest[2:], body)
        if rest[:2] == ["global", "operations"] and len(rest) == 3:
            return self._poll_compute(rest[2])
        return self._not_found(path)

    def _zonal(self, method: str, zone: str, rest: list[str],
               query: dict[str, str], body: Any = None) -> tuple[int, dict[str, Any]]:
        base = f"projects/{self.project}/zones/{zone}"
        if not rest:
            return 200, {"kind": "compute#zone", "name": zone,
                         "status": self.zone_status.get(zone, "UP"),
                         "region": f"{COMPUTE}/projects/{self.project}/regions/{self.zones[zone]}"}
        if rest[0] == "machineTypes" and len(rest) == 2:
            if rest[1] not in self.machine_types:
                return self._not_found(f"{base}/machineTypes/{rest[1]}")
            return 200, {"kind": "compute#machineType", "name": rest[1],
                         "guestCpus": self.machine_types[rest[1]]}
        if rest[0] == "operations" and len(rest) == 2:
            return self._poll_compute(rest[1])
        if rest[0] != "instances":
            return self._not_found(f"{base}/{'/'.join(rest)}")
        if len(rest) == 1 and method == "GET":
            return self._list_instances(zone, query)
        if len(rest) == 1 and method == "POST":
            return self._insert_instance(zone, body or {})
        name = rest[1] if len(rest) in (2, 3) else ""
        instance = self.instances.get((zone, name))
        if instance is None:
            return self._not_found(f"{base}/instances/{name}")
        if len(rest) == 3 and rest[2] == "setLabels" and method == "POST":
            return self._set_labels(zone, instance, body or {})
        if len(rest) == 3:
            return self._not_found(f"{base}/instances/{name}/{rest[2]}")
        if method == "GET":
            return 200, instance
        if method == "DELETE":
            if "tpu_cores" in instance["labels"]:
                return 400, compute_error(
                    400, "resourceInUseByAnotherResource",
                    f"The instance '{name}' is managed by Cloud TPU and cannot be deleted directly")
            instance["status"] = "STOPPING"

            def delete() -> None:
                self.instances.pop((zone, name), None)
                if self.machines is not None:
                    self.machines.shutdown(name)

            return 200, self._compute_op("delete", f"{base}/instances/{name}", zone, delete)
        return 400, compute_error(400, "badRequest", f"unsupported {method}")

    def _list_instances(self, zone: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        expression = query.get("filter", "")
        try:
            items = [i for (z, _), i in sorted(self.instances.items()) if z == zone
                     and (self.ignore_filter or matches(expression, i))]
        except FilterError:
            return 400, compute_error(400, "invalid", f"Invalid value for field 'filter': "
                                                      f"'{expression}'. Invalid list filter "
                                                      "expression.")
        size = (min(int(query["maxResults"]) or 500, self.page_size) if "maxResults" in query
                else self.default_page_size)
        start = int(query.get("pageToken", "0"))
        page: dict[str, Any] = {"kind": "compute#instanceList", "id": f"projects/{self.project}/"
                                f"zones/{zone}/instances",
                                "selfLink": f"{COMPUTE}/projects/{self.project}/zones/{zone}/"
                                            "instances"}
        if items[start:start + size]:
            page["items"] = items[start:start + size]
        if start + size < len(items):
            page["nextPageToken"] = str(start + size)
        return 200, page

    def _boot(self, name: str, hosts: int, ssh_keys: str,
              attributes: dict[str, str]) -> list[str] | None:
        if self.machines is not None:
            return self.machines.boot(name, hosts, ssh_keys, attributes)
        return [f"10.128.0.{next(self._addresses)}" for _ in range(hosts)]

    def _insert_instance(self, zone: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        base = f"projects/{self.project}/zones/{zone}"
        name = str(body.get("name", ""))
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            return 400, compute_error(400, "invalid", f"Invalid value for field 'resource.name': "
                                                      f"'{name}'. Must be a match of regex "
                                                      "'[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?'")
        problem = label_problem(body.get("labels"))
        if problem:
            return 400, compute_error(400, "invalid", f"Invalid value for field "
                                                      f"'resource.labels': {problem}")
        if (zone, name) in self.instances:
            return 409, compute_error(409, "alreadyExists",
                                      f"The resource '{base}/instances/{name}' already exists")
        machine_type = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        if machine_type not in self.machine_types:
            return 400, compute_error(400, "invalid", "Invalid value for field "
                                                      f"'resource.machineType': '{machine_type}'")
        labels = dict(body.get("labels") or {})
        items = (body.get("metadata") or {}).get("items") or []
        keys = next((str(i.get("value", "")) for i in items if i.get("key") == "ssh-keys"), "")
        addresses = None if zone in self.stockout_zones else self._boot(name, 1, keys, {})
        interfaces = []
        for k, requested in enumerate(body.get("networkInterfaces") or [{}]):
            interface = {**requested, "kind": "compute#networkInterface", "name": f"nic{k}",
                         "networkIP": addresses[0] if addresses else ""}
            if requested.get("accessConfigs") and addresses:
                interface["accessConfigs"] = [{**requested["accessConfigs"][0],
                                               "kind": "compute#accessConfig",
                                               "natIP": addresses[0]}]
            interfaces.append(interface)
        instance = {
            **body, "kind": "compute#instance", "id": str(next(self._ids)), "name": name,
            "zone": f"{COMPUTE}/{base}", "machineType": f"{COMPUTE}/{base}/machineTypes/"
                                                         f"{machine_type}",
            "status": "PROVISIONING", "labels": labels,
            "labelFingerprint": label_fingerprint(labels), "networkInterfaces": interfaces,
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000-07:00"),
            "selfLink": f"{COMPUTE}/{base}/instances/{name}",
        }
        if addresses is None:  # a stockout: the operation fails, nothing is left behind
            error = {"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                     "message": f"The zone '{base}' does not have enough resources available to "
                                "fulfill the request. Try a different zone, or try again later."}
            operation = self._compute_op("insert", f"{base}/instances/{name}", zone, None)
            self.operations[operation["name"]].error = error
            return 200, operation
        self.instances[(zone, name)] = instance
        return 200, self._compute_op("insert", f"{base}/instances/{name}", zone,
                                     lambda: instance.__setitem__("status", "RUNNING"))

    def _set_labels(self, zone: str, instance: dict[str, Any],
                    body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("labelFingerprint") != instance["labelFingerprint"]:
            return 412, compute_error(412, "conditionNotMet", "Labels fingerprint either invalid "
                                                              "or resource labels have changed")
        labels = dict(body.get("labels") or {})
        problem = label_problem(labels)
        if problem:
            return 400, compute_error(400, "invalid", f"Invalid value for field 'labels': {problem}")

        def apply() -> None:
            instance["labels"] = labels
            instance["labelFingerprint"] = label_fingerprint(labels)

        target = f"projects/{self.project}/zones/{zone}/instances/{instance['name']}"
        return 200, self._compute_op("setLabels", target, zone, apply)

    def _firewalls(self, method: str, rest: list[str], body: Any) -> tuple[int, dict[str, Any]]:
        base = f"projects/{self.project}/global/firewalls"
        if not rest and method == "POST":
            name = body["name"]
            if name in self.firewalls:
                return 409, compute_error(409, "alreadyExists",
                                          f"The resource '{base}/{name}' already exists")
            rule = {"kind": "compute#firewall", "id": str(next(self._ids)), **body,
                    "network": f"{COMPUTE}/{body['network']}",
                    "selfLink": f"{COMPUTE}/{base}/{name}"}
            return 200, self._compute_op("insert", f"{base}/{name}", None,
                                         lambda: self.firewalls.__setitem__(name, rule),
                                         kind="firewall")
        name = rest[0] if rest else ""
        rule = self.firewalls.get(name)
        if rule is None:
            return self._not_found(f"{base}/{name}")
        if method == "GET":
            return 200, rule
        if method == "PATCH":
            return 200, self._compute_op("patch", f"{base}/{name}", None,
                                         lambda: rule.update(body), kind="firewall")
        if method == "DELETE":
            return 200, self._compute_op("delete", f"{base}/{name}", None,
                                         lambda: self.firewalls.pop(name, None), kind="firewall")
        return 400, compute_error(400, "badRequest", f"unsupported {method}")

    def _compute_op(self, verb: str, target: str, zone: str | None, effect: Any,
                    kind: str = "instance") -> dict[str, Any]:
        name = f"operation-{int(time.time() * 1000)}-{next(self._ids):x}"
        where = f"zones/{zone}" if zone else "global"
        op: dict[str, Any] = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name,
            "operationType": verb, "targetLink": f"{COMPUTE}/{target}", "status": "PENDING",
            "progress": 0, "insertTime": "2026-01-01T00:00:00.000-08:00",
            "selfLink": f"{COMPUTE}/projects/{self.project}/{where}/operations/{name}",
        }
        if zone:
            op["zone"] = f"{COMPUTE}/projects/{self.project}/zones/{zone}"
        error = self.op_errors.get(f"{verb}-{kind}")
        self.operations[name] = Operation(op, self.op_polls, effect, error)
        if self.op_polls <= 0:
            return self._finish(self.operations[name])
        self._finish_later(self.operations[name], self._finish)
        return dict(op)

    def _finish_later(self, operation: Operation, finish: Any) -> None:
        """With `op_seconds`, the operation finishes by itself then (the effect runs under the
        lock, as a poll's would): deleting a VM whose owner never polls still deletes it."""
        if self.op_seconds is None:
            return

        def done() -> None:
            with self.lock:
                finish(operation)

        timer = threading.Timer(self.op_seconds, done)
        timer.daemon = True
        timer.start()

    def _finish(self, operation: Operation) -> dict[str, Any]:
        body = operation.body
        if body["status"] != "DONE":
            body.update(status="DONE", progress=100, endTime="2026-01-01T00:00:05.000-08:00")
            if operation.error:
                body["error"] = {"errors": [operation.error]}
                status = OP_ERROR_STATUS.get(operation.error.get("code", ""), 400)
                body["httpErrorStatusCode"] = status
                body["httpErrorMessage"] = HTTPStatus(status).phrase.upper()
            elif operation.effect is not None:
                operation.effect()
        return dict(body)

    def _poll_compute(self, name: str) -> tuple[int, dict[str, Any]]:
        operation = self.operations.get(name)
        if operation is None:
            return self._not_found(f"projects/{self.project}/operations/{name}")
        operation.polls_left -= 1
        if operation.polls_left <= 0:
            return 200, self._finish(operation)
        operation.body.update(status="RUNNING", progress=50)
        return 200, dict(operation.body)

    def machine_at(self, ip: str) -> tuple[str, dict[str, Any], int] | None:
        """("compute" | "tpu", the resource, host index) of the node whose machine has `ip`."""
        with self.lock:
            for instance in self.instances.values():
                interface = (instance.get("networkInterfaces") or [{}])[0]
                if interface.get("networkIP") == ip and "tpu_cores" not in instance["labels"]:
                    return "compute", instance, 0
            for node in self.tpu_nodes.values():
                for index, endpoint in enumerate(node.get("networkEndpoints") or []):
                    if endpoint.get("ipAddress") == ip:
                        return "tpu", node, index
        return None

"""Every error Google documents (or that the AIP-193 / discovery conventions define) injected into
every call rayfleet makes itself, and what the caller gets: transient ones retried within the
limit, the rest one line naming the cause and the fix, sent once. The table in
infra/providers/gcp_tpu/NOTES.md ("Google's errors and what rayfleet does") is this file's."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from infra.node.gcp_tpu import queued
from infra.node.gcp_tpu.api import (
    ApiOptions,
    Credentials,
    Gcp,
    GcpApiDisabledError,
    GcpCredentialsError,
    GcpError,
    GcpNotFoundError,
    GcpOperationError,
    GcpPermissionError,
    GcpQuotaError,
)
from tests.gcp_tpu.conftest import PROJECT, ZONE
from tests.gcp_tpu.fake_errors import compute_error, grpc_error, quota_exhausted, service_disabled
from tests.gcp_tpu.fake_gcp import FakeGcp

QR = "rf-0a1b2c3d-slice-0-0"
QR_FULL = f"projects/{PROJECT}/locations/{ZONE}/queuedResources/{QR}"
NODE_FULL = f"projects/{PROJECT}/locations/{ZONE}/nodes/tpu-1"
FIREWALL = {"name": "fw-new", "network": "global/networks/default", "sourceRanges": ["10.0.0.0/8"],
            "allowed": [{"IPProtocol": "tcp", "ports": ["8265"]}]}


#: A running operation of each kind, started by the fixture, for the polls.
OPERATIONS: dict[str, dict[str, Any]] = {}


@dataclass(frozen=True)
class Call:
    """One call of the product: its HTTP verb and path (regex), the API's error style, and how
    to make it."""

    verb: str
    path: str
    api: str  # "compute" | "tpu" | "serviceusage"
    run: Callable[[Gcp], Any]
    #: A delete: answers "gone" (None) for a 404, instead of raising.
    delete: bool = False


def _queued_body(node_id: str = "qr-node") -> dict[str, Any]:
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    return {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": node_id, "node": {
        "acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base",
        "labels": {"rayfleet-cluster": "0a1b2c3d"}}}]}, "spot": {}}


CALLS = {
    "projects.get": Call("GET", r"/projects/test-project$", "compute", lambda a: a.get_project()),
    "zones.get": Call("GET", r"/zones/us-central2-b$", "compute", lambda a: a.get_zone(ZONE)),
    "regions.get": Call("GET", r"/regions/us-central2$", "compute",
                        lambda a: a.get_region("us-central2")),
    "machineTypes.get": Call("GET", r"/machineTypes/", "compute",
                             lambda a: a.get_machine_type(ZONE, "n2-standard-4")),
    "networks.get": Call("GET", r"/networks/default$", "compute",
                         lambda a: a.get_network("default")),
    "instances.list": Call("GET", r"/instances$", "compute",
                           lambda a: a.instances(ZONE, {"ray-cluster-name": "c"})),
    "instances.delete": Call("DELETE", r"/instances/vm-1$", "compute",
                             lambda a: a.delete_instance(ZONE, "vm-1"), delete=True),
    "firewalls.get": Call("GET", r"/firewalls/fw-1$", "compute", lambda a: a.get_firewall("fw-1"),
                          delete=True),
    "firewalls.insert": Call("POST", r"/global/firewalls$", "compute",
                             lambda a: a.insert_firewall(dict(FIREWALL))),
    "firewalls.patch": Call("PATCH", r"/firewalls/fw-1$", "compute", lambda a: a.patch_firewall(
        "fw-1", {"name": "fw-1", "sourceRanges": ["10.1.0.0/16"]})),
    "firewalls.delete": Call("DELETE", r"/firewalls/fw-1$", "compute",
                             lambda a: a.delete_firewall("fw-1"), delete=True),
    "zoneOperations.get": Call("GET", r"/zones/us-central2-b/operations/", "compute",
                               lambda a: a.poll(dict(OPERATIONS["compute"]), "op")),
    "acceleratorTypes.list": Call("GET", r"/acceleratorTypes$", "tpu",
                                  lambda a: a.accelerator_types(ZONE)),
    "runtimeVersions.list": Call("GET", r"/runtimeVersions$", "tpu",
                                 lambda a: a.runtime_versions(ZONE)),
    "nodes.list": Call("GET", r"/nodes$", "tpu", lambda a: a.tpu_nodes(ZONE, {})),
    "nodes.delete": Call("DELETE", r"/nodes/tpu-1$", "tpu", lambda a: a.delete_tpu_node(NODE_FULL),
                         delete=True),
    "operations.get": Call("GET", r"/locations/us-central2-b/operations/", "tpu",
                           lambda a: a.poll(dict(OPERATIONS["tpu"]), "op")),
    "queuedResources.create": Call("POST", r"/queuedResources$", "tpu", lambda a: queued.create(
        a, ZONE, "rf-0a1b2c3d-slice-0-1", _queued_body("qr-node-1"))),
    "queuedResources.list": Call("GET", r"/queuedResources$", "tpu",
                                 lambda a: queued.listed(a, ZONE, "0a1b2c3d")),
    "queuedResources.get": Call("GET", rf"/queuedResources/{QR}$", "tpu",
                                lambda a: queued.get(a, QR_FULL), delete=True),
    "queuedResources.delete": Call("DELETE", rf"/queuedResources/{QR}$", "tpu",
                                   lambda a: queued.delete(a, QR_FULL), delete=True),
    "consumerQuotaMetrics.list": Call("GET", r"/consumerQuotaMetrics$", "serviceusage",
                                      lambda a: a.tpu_quota_metrics()),
}


def _error(api: str, status: int, compute_reason: str, grpc_status: str, message: str) -> dict:
    if api == "compute":
        return compute_error(status, compute_reason, message)
    service = f"{api}.googleapis.com"
    return grpc_error(status, grpc_status, message, service=service)


#: name -> (body maker, the error type the caller gets, whether it is retried).
ERRORS: dict[str, tuple[Callable[[str], dict], type[GcpError] | None, bool]] = {
    "400 invalid": (lambda api: _error(api, 400, "invalid", "INVALID_ARGUMENT",
                                       "Invalid value for field 'resource.name'"), GcpError, False),
    "400 failed precondition": (lambda api: _error(api, 400, "badRequest", "FAILED_PRECONDITION",
                                                   "The resource is not ready"), GcpError, False),
    "401 unauthenticated": (lambda api: _error(api, 401, "authError", "UNAUTHENTICATED",
                                               "Request had invalid authentication credentials."),
                            GcpCredentialsError, False),
    "403 permission denied": (lambda api: _error(api, 403, "forbidden", "PERMISSION_DENIED",
                                                 "Required 'compute.instances.list' permission"),
                              GcpPermissionError, False),
    "403 API disabled": (lambda api: service_disabled(f"{api}.googleapis.com"),
                         GcpApiDisabledError, False),
    "403 quota exceeded": (lambda api: _error(api, 403, "quotaExceeded", "PERMISSION_DENIED",
                                              "Quota 'FIREWALLS' exceeded.  Limit: 200.0 globally."),
                           GcpQuotaError, False),
    "403 rate limit": (lambda api: compute_error(403, "rateLimitExceeded", "Rate Limit Exceeded"),
                       None, True),
    "404 not found": (lambda api: _error(api, 404, "notFound", "NOT_FOUND",
                                         "The resource was not found"), GcpNotFoundError, False),
    "409 already exists": (lambda api: _error(api, 409, "alreadyExists", "ALREADY_EXISTS",
                                              "The resource already exists"), GcpError, False),
    "409 aborted": (lambda api: _error(api, 409, "conflict", "ABORTED",
                                       "Operation was aborted due to a conflict"), GcpError, False),
    "412 condition not met": (lambda api: compute_error(412, "conditionNotMet",
                                                        "Labels fingerprint either invalid"),
                              GcpError, False),
    "429 rate limit": (lambda api: _error(api, 429, "rateLimitExceeded", "RESOURCE_EXHAUSTED",
                                          "Quota exceeded for quota metric 'Read requests' and "
                                          "limit 'Read requests per minute'"), None, True),
    "429 quota exhausted": (lambda api: quota_exhausted("TPUV4PodPerProjectPerZoneForTPUAPI",
                                                        "zone us-central2-b"),
                            GcpQuotaError, False),
    "500 internal": (lambda api: _error(api, 500, "backendError", "INTERNAL", "Internal error"),
                     None, True),
    "502 bad gateway": (lambda api: compute_error(502, "backendError", "Bad Gateway"), None, True),
    "503 unavailable": (lambda api: _error(api, 503, "backendError", "UNAVAILABLE",
                                           "The service is currently unavailable."), None, True),
    "504 deadline": (lambda api: _error(api, 504, "backendError", "DEADLINE_EXCEEDED",
                                        "Deadline exceeded"), None, True),
}
#: Errors in Compute's shape only (the gRPC-style APIs have no such reason).
COMPUTE_ONLY = {"403 rate limit", "412 condition not met", "502 bad gateway"}


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[FakeGcp, Gcp]]:
    """One fake and one client for the whole matrix (building Compute's client takes ~0.7 s)."""
    server = FakeGcp(PROJECT).start()
    options = ApiOptions(endpoint=server.url, poll_interval=0.02, retry_base=0.01, retries=3,
                         timeout=10)
    yield server, Gcp(PROJECT, Credentials(None, "test", None), options, sleep=lambda _: None)
    server.stop()


@pytest.fixture
def fake(shared: tuple[FakeGcp, Gcp]) -> FakeGcp:
    return shared[0]


@pytest.fixture
def api(shared: tuple[FakeGcp, Gcp]) -> Gcp:
    """The matrix's resources as they were, and a running operation of each kind to poll."""
    fake, gcp = shared
    with fake.lock:
        fake.failures.clear()
        fake.op_errors.clear()
        fake.instances.clear()
        fake.tpu_nodes.clear()
        fake.queued.clear()
        fake.op_polls = 1000  # the polled operations keep running
    fake.add_instance(ZONE, "vm-1", {"ray-cluster-name": "c"})
    fake.add_instance(ZONE, "vm-2", {})
    fake.add_tpu_node(ZONE, "tpu-1", "v4-8", {})
    fake.add_tpu_node(ZONE, "tpu-2", "v4-8", {})
    fake.firewalls["fw-1"] = {"kind": "compute#firewall", "name": "fw-1", "id": "1",
                              "sourceRanges": ["10.0.0.0/8"]}
    queued.create(gcp, ZONE, QR, _queued_body())
    OPERATIONS["compute"] = gcp.delete_instance(ZONE, "vm-2") or {}
    OPERATIONS["tpu"] = gcp.delete_tpu_node(NODE_FULL.replace("tpu-1", "tpu-2")) or {}
    fake.op_polls = 2
    fake.requests.clear()
    return gcp


CASES = [(c, e) for c in CALLS for e in ERRORS
         if not (e in COMPUTE_ONLY and CALLS[c].api != "compute")]


@pytest.mark.parametrize(("call", "error"), CASES)
def test_every_documented_error_of_every_call(api: Gcp, fake: FakeGcp, call: str,
                                              error: str) -> None:
    spec = CALLS[call]
    make, expected, transient = ERRORS[error]
    body = make(spec.api)
    status = body["error"]["code"]
    tries = api.options.retries + 1
    if transient:
        # Passes when it clears within the retries...
        fake.fail(spec.verb, spec.path, status, body, times=api.options.retries)
        spec.run(api)
        assert len(fake.calls(spec.verb, "")) >= tries
        fake.requests.clear()
        fake.failures.clear()
        # ...and gives up after them, in one line that says it may pass.
        fake.fail(spec.verb, spec.path, status, body, times=100)
        with pytest.raises(GcpError) as caught:
            spec.run(api)
        assert caught.value.retryable, caught.value
        assert len([r for r in fake.requests if r["method"] == spec.verb
                    and re.search(spec.path, r["path"])]) == tries
    else:
        fake.fail(spec.verb, spec.path, status, body, times=100)
        if spec.delete and status == 404:
            assert spec.run(api) is None  # gone already: what a delete (or a lookup) wanted
            return
        with pytest.raises(GcpError) as caught:
            spec.run(api)
        assert expected is not None and isinstance(caught.value, expected), repr(caught.value)
        assert not caught.value.retryable
        sent = [r for r in fake.requests if r["method"] == spec.verb
                and re.search(spec.path, r["path"])]
        assert len(sent) == 1, f"a {error} was sent {len(sent)} times"
    message = str(caught.value)
    assert message.startswith("gcp-tpu: ") and "\n" not in message, message
    assert "Traceback" not in message and "HttpError" not in message


@pytest.mark.parametrize(("code", "expected", "status"), [
    ("QUOTA_EXCEEDED", GcpQuotaError, 403),
    ("ZONE_RESOURCE_POOL_EXHAUSTED", GcpOperationError, 503),
    ("RESOURCE_NOT_FOUND", None, 404),
    ("RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", GcpOperationError, 400),
])
def test_compute_operation_errors(api: Gcp, fake: FakeGcp, code: str,
                                  expected: type[GcpError] | None, status: int) -> None:
    fake.op_errors["delete-instance"] = {"code": code, "message": f"{code} happened"}
    operation = api.delete_instance(ZONE, "vm-1")
    assert operation is not None
    result = None
    for _ in range(10):
        try:
            result = api.poll(operation, "deleting vm-1")
        except GcpError as exc:
            assert expected is not None and isinstance(exc, expected), repr(exc)
            assert exc.status == status and "\n" not in str(exc) and code in str(exc)
            return
        if result is not None:
            break
    assert expected is None and result is not None  # gone meanwhile: the delete succeeded
    assert result["httpErrorStatusCode"] == status


@pytest.mark.parametrize(("code", "expected"), [
    (5, None), (8, GcpQuotaError), (3, GcpOperationError), (9, GcpOperationError),
    (13, GcpOperationError)])
def test_tpu_operation_errors(api: Gcp, fake: FakeGcp, code: int,
                              expected: type[GcpError] | None) -> None:
    fake.op_errors["delete-tpu"] = {"code": code, "message": f"code {code} happened"}
    operation = api.delete_tpu_node(NODE_FULL)
    assert operation is not None
    for _ in range(10):
        try:
            result = api.poll(operation, "deleting tpu-1")
        except GcpError as exc:
            assert expected is not None and isinstance(exc, expected), repr(exc)
            assert "\n" not in str(exc)
            return
        if result is not None:
            assert expected is None
            return
    raise AssertionError("the operation never finished")

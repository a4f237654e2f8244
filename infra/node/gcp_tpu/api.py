"""Our own Google API calls: Compute Engine v1 and Cloud TPU v2, through google-api-python-client.

Only what pre-flight, the dashboard firewall rule and teardown's sweep need. The clients are built
from the discovery documents bundled with the library (no network for discovery), and every call
goes through `_call`: the client's own `execute(num_retries=...)` retries what is transient (429,
rate-limit 403s, 5xx, dropped connections) with its backoff, except a 429 that names an exhausted
quota (errors.py), and Google's error answers become one-line `GcpError`s with typed fields.
Creates carry a `requestId`, so a create the client sends again is the same create to Google.

`ApiOptions.endpoint` (env RAYFLEET_GCP_API_ENDPOINT) points both APIs at another root URL, e.g. a
local fake in tests; requests to a loopback endpoint carry anonymous credentials and ignore proxies,
so a test can never send a real token anywhere.
"""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from infra.node.gcp_tpu.collection_cache import Collections
from infra.node.gcp_tpu.credentials import Credentials, find_credentials
from infra.node.gcp_tpu.errors import (
    GcpApiDisabledError,
    GcpCredentialsError,
    GcpError,
    GcpNotFoundError,
    GcpOperationError,
    GcpPermissionError,
    GcpQuotaError,
    _one_line,
    classify,
    is_quota_refusal,
)
from infra.node.net import is_loopback

# Re-exported: callers import the error types from here.
__all__ = ["ApiOptions", "Credentials", "Gcp", "GcpApiDisabledError", "GcpCredentialsError",
           "GcpError", "GcpNotFoundError", "GcpOperationError", "GcpPermissionError",
           "GcpQuotaError", "classify", "find_credentials"]

ENDPOINT_ENV = "RAYFLEET_GCP_API_ENDPOINT"
# The client logs every retry as a warning; output stays quiet (errors are one line of ours).
logging.getLogger("googleapiclient.http").addHandler(logging.NullHandler())
logging.getLogger("googleapiclient.http").propagate = False


@dataclass(frozen=True)
class ApiOptions:
    """How to reach Google; tests pass a loopback endpoint and short intervals."""

    #: Root URL replacing https://compute.googleapis.com/ and https://tpu.googleapis.com/.
    endpoint: str | None = None
    #: Seconds between polls of a long-running operation.
    poll_interval: float = 2.0
    #: Attempts after the first for transient errors, with exponential backoff from `retry_base`.
    retries: int = 5
    retry_base: float = 1.0
    #: Seconds one HTTP request may take.
    timeout: float = 60.0

    @classmethod
    def from_env(cls) -> ApiOptions:
        endpoint = os.environ.get(ENDPOINT_ENV) or None
        return cls(endpoint=endpoint)

    @property
    def loopback(self) -> bool:
        return self.endpoint is not None and is_loopback(self.endpoint)


def _refresh_reason(exc: Exception) -> str:
    """`invalid_grant: Invalid JWT Signature.` from google-auth's RefreshError arguments."""
    first = exc.args[0] if exc.args else exc
    return _one_line(str(first), 160)


class Gcp:
    """Compute v1 and TPU v2 calls for one project. Clients are built on first use."""

    def __init__(self, project: str, credentials: Credentials, options: ApiOptions | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.project = project
        self.options = options or ApiOptions()
        self._credentials = credentials
        self._sleep = sleep

    # --- plumbing ---------------------------------------------------------------------------

    def _http(self) -> Any:
        import google_auth_httplib2
        import httplib2
        from google.auth.credentials import AnonymousCredentials

        if self.options.loopback:
            # A fake on this machine: no token leaves the process, no proxy sees the traffic.
            return _Answers(google_auth_httplib2.AuthorizedHttp(
                AnonymousCredentials(), http=httplib2.Http(timeout=self.options.timeout,
                                                          proxy_info=None)))
        return _Answers(google_auth_httplib2.AuthorizedHttp(
            self._credentials.credentials, http=httplib2.Http(timeout=self.options.timeout)))

    def _build(self, service: str, version: str, path: str) -> Any:
        from googleapiclient import discovery

        client_options = None
        if self.options.endpoint:
            client_options = {"api_endpoint": self.options.endpoint.rstrip("/") + "/" + path}
        return Collections(discovery.build(service, version, http=self._http(), static_discovery=True,
                                           cache_discovery=False, client_options=client_options))

    @cached_property
    def compute(self) -> Any:
        return self._build("compute", "v1", "compute/v1/")

    @cached_property
    def tpu(self) -> Any:
        return self._build("tpu", "v2", "")

    @cached_property
    def service_usage(self) -> Any:
        return self._build("serviceusage", "v1beta1", "")

    def _call_or_none(self, request: Any, what: str) -> dict[str, Any] | None:
        """`_call`, or None where Google answers that the thing does not exist (a 404)."""
        try:
            return self._call(request, what)
        except GcpNotFoundError:
            return None

    def _call(self, request: Any, what: str) -> dict[str, Any]:
        import httplib2
        from google.auth import exceptions as auth_errors
        from googleapiclient.errors import HttpError

        answers: _Answers = request.http

        def backoff(seconds: float) -> None:
            # The client's wait (random up to 2**n s), scaled for tests, or Retry-After if longer.
            self._sleep(max(seconds * self.options.retry_base, answers.retry_after))

        request._sleep = backoff  # the client's documented stub for its retry sleeps
        try:
            result: dict[str, Any] = request.execute(num_retries=self.options.retries)
            return result
        except _Refused as exc:
            raise classify(exc.status, exc.content, what, self.project) from None
        except HttpError as exc:
            raise classify(exc.resp.status, exc.content, what, self.project) from None
        except (auth_errors.RefreshError, auth_errors.InvalidOperation) as exc:
            # A revoked or deleted key, an expired user login, a clock far off (or a 401 that
            # credentials which cannot refresh get): retrying cannot help, and google-auth's
            # message is a tuple repr spanning lines.
            raise GcpCredentialsError(
                f"gcp-tpu: {what}: Google refused the credentials ({_refresh_reason(exc)}); "
                f"{self._credentials.source} may be revoked or expired: run `gcloud auth "
                "application-default login` or download a new key for credentials_file:"
            ) from None
        except (OSError, httplib2.HttpLib2Error, auth_errors.TransportError) as exc:
            host = urllib.parse.urlsplit(getattr(request, "uri", "")).netloc or "Google"
            raise GcpError(f"gcp-tpu: {what}: cannot reach {host} ({_one_line(str(exc))}); "
                           "check the network and retry", retryable=True) from None

    def call(self, request: Any, what: str) -> dict[str, Any]:
        """One request through `_call` (typed errors, retries), for our other API modules."""
        return self._call(request, what)

    def _pages(self, collection: Any, request: Any, key: str, what: str) -> Iterator[dict[str, Any]]:
        while request is not None:
            response = self._call(request, what)
            yield from response.get(key, [])
            request = collection.list_next(request, response)

    # --- reads for pre-flight -----------------------------------------------------------------

    def get_project(self) -> dict[str, Any]:
        return self._call(self.compute.projects().get(project=self.project),
                          f"project {self.project}")

    def get_zone(self, zone: str) -> dict[str, Any]:
        return self._call(self.compute.zones().get(project=self.project, zone=zone), f"zone {zone}")

    def get_region(self, region: str) -> dict[str, Any]:
        return self._call(self.compute.regions().get(project=self.project, region=region),
                          f"region {region}")

    def get_machine_type(self, zone: str, machine_type: str) -> dict[str, Any]:
        return self._call(self.compute.machineTypes().get(
            project=self.project, zone=zone, machineType=machine_type),
            f"machine type {machine_type} in {zone}")

    def get_network(self, network: str) -> dict[str, Any]:
        return self._call(self.compute.networks().get(project=self.project, network=network),
                          f"network {network}")

    def _location(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def accelerator_types(self, zone: str) -> list[dict[str, Any]]:
        collection = self.tpu.projects().locations().acceleratorTypes()
        request = collection.list(parent=self._location(zone))
        return list(self._pages(collection, request, "acceleratorTypes",
                                f"TPU accelerator types in {zone}"))

    def runtime_versions(self, zone: str) -> list[dict[str, Any]]:
        collection = self.tpu.projects().locations().runtimeVersions()
        request = collection.list(parent=self._location(zone))
        return list(self._pages(collection, request, "runtimeVersions",
                                f"TPU runtime versions in {zone}"))

    # --- nodes (teardown's sweep, status) ---------------------------------------------------

    def instances(self, zone: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Compute instances in `zone` carrying all `labels`, in any status (stopped included).

        The server filters, and we check again: a filter the server ignored must never make
        teardown delete someone else's VM.
        """
        expression = " AND ".join(f"(labels.{k} = {v})" for k, v in sorted(labels.items()))
        collection = self.compute.instances()
        request = collection.list(project=self.project, zone=zone, filter=expression,
                                  maxResults=500)
        found = self._pages(collection, request, "items", f"instances in {zone}")
        return [i for i in found if _has_labels(i, labels)]

    def tpu_nodes(self, zone: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """TPU nodes in `zone` carrying all `labels` (the TPU API has no server-side filter)."""
        collection = self.tpu.projects().locations().nodes()
        request = collection.list(parent=self._location(zone))
        found = self._pages(collection, request, "nodes", f"TPU nodes in {zone}")
        return [n for n in found if _has_labels(n, labels)]

    def instances_labelled(self, zone: str, key: str) -> list[dict[str, Any]]:
        """Compute instances in `zone` that carry the label `key` with any value (the sweep's
        question: whose are they?), in any status."""
        collection = self.compute.instances()
        request = collection.list(project=self.project, zone=zone, filter=f"labels.{key}:*",
                                  maxResults=500)
        found = self._pages(collection, request, "items", f"instances in {zone}")
        return [i for i in found if key in (i.get("labels") or {})]

    def tpu_node(self, name: str) -> dict[str, Any]:
        """TPU node `name` (full resource name), as Google describes it now."""
        return self._call(self.tpu.projects().locations().nodes().get(name=name),
                          f"TPU node {name.rsplit('/', 1)[-1]}")

    def delete_instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """Start deleting; the operation, or None if the instance is already gone."""
        return self._call_or_none(self.compute.instances().delete(
            project=self.project, zone=zone, instance=name), f"deleting instance {name}")

    def delete_tpu_node(self, name: str) -> dict[str, Any] | None:
        """Start deleting TPU node `name` (full resource name); None if already gone or going."""
        nodes = self.tpu.projects().locations().nodes()
        return self.delete_once(nodes.delete(name=name), nodes.get(name=name),
                                f"deleting TPU node {name.rsplit('/', 1)[-1]}")

    def delete_once(self, delete: Any, get: Any, what: str) -> dict[str, Any] | None:
        """Start a TPU delete; None when the thing is gone or already DELETING.

        Google does not document what deleting something already being deleted answers;
        FAILED_PRECONDITION (400) or a 409 is what AIP-style APIs send for "not in a state for
        that". Either is success here once a look shows it DELETING or gone (NOTES.md): the
        caller goes on waiting for it to vanish, as it does after its own delete."""
        try:
            return self._call_or_none(delete, what)
        except GcpError as exc:
            if exc.status not in (400, 409):
                raise
            found = self._call_or_none(get, what)
            if found is not None and _state(found) != "DELETING":
                raise
            return None

    # --- queued TPU resources (infra/node/gcp_tpu/queued.py) ----------------------------------

    def _queued_resources(self) -> Any:
        return self.tpu.projects().locations().queuedResources()

    def queued_resources(self, zone: str) -> list[dict[str, Any]]:
        """Every queued resource in `zone`, in any state (the caller picks its own)."""
        collection = self._queued_resources()
        request = collection.list(parent=self._location(zone))
        return list(self._pages(collection, request, "queuedResources",
                                f"queued TPU requests in {zone}"))

    def queued_resource(self, name: str) -> dict[str, Any] | None:
        """Queued resource `name` (full resource name); None when it does not exist."""
        return self._call_or_none(self._queued_resources().get(name=name),
                                  f"queued TPU request {name}")

    def create_queued_resource(self, zone: str, qr_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Queue a request (the operation Google returns); a request id makes a retry harmless."""
        return self._call(self._queued_resources().create(
            parent=self._location(zone), queuedResourceId=qr_id, body=body,
            requestId=request_id()), f"queueing TPU request {qr_id} in {zone}")

    def delete_queued_resource(self, name: str) -> dict[str, Any] | None:
        """Delete a request and (`force`) the TPU nodes it holds; None if already gone or
        already DELETING."""
        collection = self._queued_resources()
        return self.delete_once(collection.delete(name=name, force=True), collection.get(name=name),
                                f"deleting queued TPU request {name.rsplit('/', 1)[-1]}")

    def tpu_quota_metrics(self) -> list[dict[str, Any]]:
        """The project's quota metrics of the Cloud TPU API with every zone's bucket (Service
        Usage v1beta1 `consumerQuotaMetrics`, the only bundled API that lists TPU quotas)."""
        collection = self.service_usage.services().consumerQuotaMetrics()
        request = collection.list(parent=f"projects/{self.project}/services/tpu.googleapis.com",
                                  view="FULL")
        return list(self._pages(collection, request, "metrics", "TPU quotas"))

    # --- firewall rule for the dashboard ----------------------------------------------------

    def get_firewall(self, name: str) -> dict[str, Any] | None:
        return self._call_or_none(self.compute.firewalls().get(project=self.project,
                                                               firewall=name),
                                  f"firewall rule {name}")

    def insert_firewall(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.compute.firewalls().insert(project=self.project, body=body,
                                                          requestId=request_id()),
                          f"creating firewall rule {body['name']}")

    def patch_firewall(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.compute.firewalls().patch(project=self.project, firewall=name,
                                                         body=body),
                          f"updating firewall rule {name}")

    def delete_firewall(self, name: str) -> dict[str, Any] | None:
        return self._call_or_none(self.compute.firewalls().delete(project=self.project,
                                                                  firewall=name),
                                  f"deleting firewall rule {name}")

    # --- long-running operations ------------------------------------------------------------

    def poll(self, operation: dict[str, Any], what: str) -> dict[str, Any] | None:
        """One look at an operation (Compute zonal/global or TPU): the finished operation, None
        while it runs, or the operation's own error raised as GcpError."""
        if "status" not in operation and operation.get("kind") != "compute#operation":
            return self._poll_tpu(operation, what)  # TPU operations have `done`, not `status`
        if operation.get("status") != "DONE":
            name = operation["name"]
            zone = str(operation.get("zone") or "").rsplit("/", 1)[-1]
            request = (self.compute.zoneOperations().get(project=self.project, zone=zone,
                                                         operation=name)
                       if zone else
                       self.compute.globalOperations().get(project=self.project, operation=name))
            operation = self._call(request, f"{what} (operation {name})")
            if operation.get("status") != "DONE":
                return None
        errors = (operation.get("error") or {}).get("errors") or []
        if errors:
            first = errors[0]
            code = str(first.get("code", ""))
            message = _one_line(str(first.get("message", code)))
            if "QUOTA" in code:
                raise GcpQuotaError(
                    f"gcp-tpu: {what}: quota exceeded ({message}); free some or request more at "
                    f"https://console.cloud.google.com/iam-admin/quotas?project={self.project}",
                    status=int(operation.get("httpErrorStatusCode") or 0), reason=code)
            if code == "RESOURCE_NOT_FOUND":
                return operation  # deleting something that vanished meanwhile is success
            raise GcpOperationError(f"gcp-tpu: {what} failed: {code}: {message}",
                                    status=int(operation.get("httpErrorStatusCode") or 0),
                                    reason=code)
        return operation

    def _poll_tpu(self, operation: dict[str, Any], what: str) -> dict[str, Any] | None:
        if not operation.get("done"):
            operation = self._call(
                self.tpu.projects().locations().operations().get(name=operation["name"]),
                f"{what} (operation {operation['name'].rsplit('/', 1)[-1]})")
            if not operation.get("done"):
                return None
        error = operation.get("error")
        if error:
            # google.rpc.Status: 5 NOT_FOUND means it was gone already; 8 is RESOURCE_EXHAUSTED.
            code = int(error.get("code", 0))
            message = _one_line(str(error.get("message", "")))
            if code == 5:
                return operation
            if code == 8 or "quota" in message.lower():
                raise GcpQuotaError(
                    f"gcp-tpu: {what}: quota or capacity exhausted ({message}); free some or "
                    f"request more at https://console.cloud.google.com/iam-admin/quotas?project="
                    f"{self.project}", reason="RESOURCE_EXHAUSTED")
            raise GcpOperationError(f"gcp-tpu: {what} failed: {message} (code {code})",
                                    reason=str(code))
        return operation


def request_id() -> str:
    """A fresh `requestId` (a UUID, as Compute and the TPU API ask) for one create: the client's
    retries resend the same request, so Google sees one create however often it arrives."""
    return str(uuid.uuid4())


def _state(resource: dict[str, Any]) -> str:
    state = resource.get("state")
    return str(state.get("state") if isinstance(state, dict) else state or "")


class _Refused(Exception):
    """An answer the client must not retry (raised past its retry loop, which retries every 429)."""

    def __init__(self, status: int, content: bytes) -> None:
        super().__init__(status)
        self.status = status
        self.content = content


class _Answers:
    """The client's http object, wrapped: sees every answer before the client's retry loop does,
    stops it on a quota refusal, and keeps the last Retry-After for the backoff."""

    def __init__(self, http: Any) -> None:
        self.http = http
        self.retry_after = 0.0

    def request(self, uri: str, method: str = "GET", body: Any = None, headers: Any = None,
                **kwargs: Any) -> tuple[Any, bytes]:
        resp, content = self.http.request(uri, method, body=body, headers=headers, **kwargs)
        if is_quota_refusal(resp.status, content):
            raise _Refused(resp.status, content)
        after = str(resp.get("retry-after", ""))
        self.retry_after = min(float(after), 60.0) if after.isdigit() else 0.0
        return resp, content

    def __getattr__(self, name: str) -> Any:
        return getattr(self.http, name)


def _has_labels(resource: dict[str, Any], labels: dict[str, str]) -> bool:
    have = resource.get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())

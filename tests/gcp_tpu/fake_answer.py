"""How the fake answers a request, whatever carries it (its loopback server, or the offline
Google on the test bed): held to the discovery documents both ways (tests/gcp_tpu/discovery.py),
injected failures first, `requestId`s remembered, then the API's own state machines."""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from tests.gcp_tpu.discovery import Contract, Method, Violation
from tests.gcp_tpu.fake_errors import compute_error, grpc_error, service_disabled

CONTRACT = Contract()


class Answering:
    """Mixed into FakeGcp, whose state and API handlers it uses."""

    lock: threading.RLock
    violations: list[str]
    failures: list[Any]
    disabled: set[str]
    by_request_id: dict[str, str]
    operations: dict[str, Any]

    if TYPE_CHECKING:  # provided by FakeGcp and its other mixins (stubs here would shadow them)
        def _compute(self, method: str, path: str, query: dict[str, str],
                     body: Any) -> tuple[int, dict[str, Any]]: ...

        def _tpu(self, method: str, path: str, query: dict[str, str], body: Any = None,
                 version: str = "v2") -> tuple[int, dict[str, Any]]: ...

        def _service_usage(self, method: str, path: str,
                           query: dict[str, str]) -> tuple[int, dict[str, Any]]: ...

    def take_violations(self) -> list[str]:
        """The violations so far, cleared: for tests that send a bad request on purpose."""
        with self.lock:
            found, self.violations = self.violations, []
        return found

    def _answer(self, method: str, path: str, query: dict[str, str],
                body: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Google's answer, both sides held to the discovery documents: a request they reject
        gets Google's 400 (404 for no such method) and is recorded as a violation; so is an
        answer of the fake (or an injected failure) that does not fit the reference."""
        try:
            api_method: Method | None = CONTRACT.request(method, path, query, body)
        except Violation as exc:
            self.violations.append(f"request {exc}")
            status = 404 if "(rule: method" in str(exc) else 400
            return status, self._invalid(path, status, str(exc)), {}
        status, payload, headers = self._serve(method, path, query, body)
        try:
            CONTRACT.response(api_method, status, payload)
        except Violation as exc:
            self.violations.append(f"answer {exc}")
        return status, payload, headers

    @staticmethod
    def _invalid(path: str, status: int, message: str) -> dict[str, Any]:
        if path.startswith("/compute/"):
            return compute_error(status, "invalid" if status == 400 else "notFound", message)
        if status == 404:
            return grpc_error(404, "NOT_FOUND", message)
        error = grpc_error(400, "INVALID_ARGUMENT", message)
        error["error"]["details"] = [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                                      "fieldViolations": [{"field": message.split(": ")[1]
                                                           if ": " in message else "",
                                                           "description": message}]}]
        return error

    def _serve(self, method: str, path: str, query: dict[str, str],
               body: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        # requestId (Compute inserts, TPU creates and deletes): the same id is the same request,
        # answered with the operation it started (as it is now), never done twice.
        seen = self.by_request_id.get(query.get("requestId", ""))
        if seen is not None:
            return 200, self._operation_now(seen), {}
        status, payload, headers = self._serve_once(method, path, query, body)
        return status, payload, headers

    def _operation_now(self, name: str) -> dict[str, Any]:
        return {k: v for k, v in self.operations[name].body.items() if k != "_result"}

    def _serve_once(self, method: str, path: str, query: dict[str, str],
                    body: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        for failure in self.failures:
            if failure.times > 0 and failure.method == method and re.search(failure.path, path):
                failure.times -= 1
                if not failure.after:
                    return failure.status, failure.body, failure.headers
                # Google did it, but the answer was lost: the caller sees only the error.
                self._remember(query, *self._serve_api(method, path, query, body))
                return failure.status, failure.body, failure.headers
        status, payload = self._serve_api(method, path, query, body)
        self._remember(query, status, payload)
        return status, payload, {}

    def _remember(self, query: dict[str, str], status: int, payload: dict[str, Any]) -> None:
        if query.get("requestId") and status == 200 and payload.get("name") in self.operations:
            self.by_request_id[query["requestId"]] = payload["name"]

    def _serve_api(self, method: str, path: str, query: dict[str, str],
                   body: Any) -> tuple[int, dict[str, Any]]:
        if path.startswith("/compute/v1/"):
            if "compute" in self.disabled:
                return 403, service_disabled("compute.googleapis.com")
            return self._compute(method, path.removeprefix("/compute/v1/"), query, body)
        if path.startswith(("/v2/", "/v2alpha1/")):
            if "tpu" in self.disabled:
                return 403, service_disabled("tpu.googleapis.com")
            version, _, rest = path[1:].partition("/")
            return self._tpu(method, rest, query, body, version)
        if path.startswith("/v1beta1/"):
            if "serviceusage" in self.disabled:
                return 403, service_disabled("serviceusage.googleapis.com")
            return self._service_usage(method, path.removeprefix("/v1beta1/"), query)
        return 404, {"error": {"code": 404, "message": f"no such API: {path}"}}

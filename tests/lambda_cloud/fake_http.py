"""The fake Lambda API's wire protocol, on the shared fake base (tests/fakes/http.py): auth, rate
limits, errors as Lambda's reference defines them, and the contract check against that reference
(tests/reference/lambda/). Only 127.0.0.1 is ever bound; see fake_api.py for the model behind it.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import functools
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from werkzeug.wrappers import Request

from tests.fakes.http import Answer, FakeHttpServer, Fault, Violation
from tests.fakes.openapi import OpenApiValidator

REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "lambda" / \
    "lambda-cloud-openapi-1.8.3.json"
PREFIX = "/api/v1"


@functools.cache
def reference() -> OpenApiValidator:
    """Lambda's OpenAPI 1.8.3, parsed once per process."""
    return OpenApiValidator(REFERENCE, PREFIX)


#: Locations of the regions we know; the reference lists codes only (PublicRegionCode).
_PLACES = {
    "us-east-1": "Virginia, USA", "us-west-1": "California, USA", "us-west-2": "Arizona, USA",
    "us-south-1": "Texas, USA", "us-midwest-1": "Illinois, USA", "europe-central-1": "Germany",
    "asia-northeast-1": "Tokyo, Japan", "me-west-1": "Israel", "us-east-3": "Washington DC, USA",
}
#: Every region the reference lists, with a description (the code itself where we know none).
REGIONS = {code: _PLACES.get(code, code)
           for code in reference().spec["components"]["schemas"]["PublicRegionCode"]["enum"]}


class Reject(Exception):
    """Raised by the model: answer with Lambda's documented error `code`."""

    def __init__(self, code: str, message: str | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.message = message


@dataclass
class Bucket:
    """At most one request per `interval`, judged by the moments requests arrived, in whatever
    order the fake gets round to them (a request that arrived first may be served second)."""

    interval: float
    #: Arrival times of the requests accepted lately, sorted.
    accepted: list[float] = field(default_factory=list)
    #: Accept a request this much (fraction of interval) early: clocks differ a little (NTP:
    #: within 500 ppm). Kept under the client's margin (pacing.Limits.margin, 0.5 %), so that a
    #: client spaced too tightly meets a 429 here rather than passing on the fake's leniency.
    tolerance: float = 0.001

    def take(self, now: float) -> bool:
        if self.interval <= 0:
            return True
        gap = self.interval * (1 - self.tolerance)
        if any(abs(now - at) < gap for at in self.accepted):
            return False
        bisect.insort(self.accepted, now)
        del self.accepted[:-64]
        return True

    def give_back(self, now: float) -> None:
        """A request accepted at `now` does not count after all (refused for another reason)."""
        with contextlib.suppress(ValueError):
            self.accepted.remove(now)


def error_answer(method: str, path: str, code: str, message: str | None = None,
                 status: int | None = None) -> Answer:
    """Lambda's error `code` as this operation documents it: its status and its error schema's
    texts (`{"error": {code, message, suggestion?}}`, the reference's defaults where it has them).
    A code the operation does not document still gets a body (from any operation's schema); the
    contract check then reports it."""
    ref = reference()
    found = ref.operation(method, path)
    documented = ref.documented_errors(method, found[0]) if found else []
    anywhere = [e for template, ops in ref.spec["paths"].items() for verb in ops
                if verb in ("get", "post", "patch", "delete", "put")
                for e in ref.documented_errors(verb, template)]
    matches = [e for e in documented if e[1] == code and status in (None, e[0])] \
        or [e for e in anywhere if e[1] == code]
    if not matches:
        raise KeyError(f"{code} is not an error code of Lambda's reference")
    found_status, _, schema = matches[0]
    props = schema["properties"]
    error = {"code": code,
             "message": message or props["message"].get("default", f"{code} (fake)")}
    if "suggestion" in props and ("default" in props["suggestion"]
                                  or "suggestion" in schema.get("required", [])):
        error["suggestion"] = props["suggestion"].get("default", "Check the request and retry.")
    return Answer(status or found_status, {"error": error})


class LambdaHttp(FakeHttpServer):
    """What `FakeLambda` gains: auth, rate limits, faults and errors as Lambda sends them."""

    prefix = PREFIX
    api_key: str
    general: Bucket
    launches: Bucket

    def model(self, method: str, path: str, body: Any) -> Any:
        raise NotImplementedError

    def handle(self, method: str, path: str, body: Any, request: Request) -> Answer:
        try:
            return Answer(200, {"data": self.model(method, path, body)})
        except Reject as rej:
            return error_answer(method, path, rej.code, rej.message)

    def authorized(self, header: str) -> bool:
        if header.startswith("Bearer "):
            return secrets.compare_digest(header[7:], self.api_key)
        if header.startswith("Basic "):
            try:
                decoded = base64.b64decode(header[6:]).decode()
            except ValueError:
                return False
            return secrets.compare_digest(decoded, f"{self.api_key}:")
        return False

    def authenticate(self, request: Request) -> Answer | None:
        if self.authorized(request.headers.get("Authorization", "")):
            return None
        return error_answer(request.method, request.path[len(PREFIX):], "global/invalid-api-key")

    def throttle(self, method: str, path: str, now: float) -> Answer | None:
        # The reference documents the limits in prose but no 429 answer: its body is unknown, so
        # the fake sends no JSON at all (rayfleet must decide on the status alone).
        if not self.general.take(now):
            return Answer(429, raw=b"Too Many Requests")
        if method == "POST" and path == "/instance-operations/launch" and not self.launches.take(now):
            self.general.give_back(now)  # refused requests do not count
            return Answer(429, raw=b"Too Many Requests")
        return None

    def fault_answer(self, method: str, path: str, fault: Fault) -> Answer:
        if fault.code is None:
            return Answer(fault.status, raw=b"injected failure: no documented body")
        if fault.code.startswith("provider/"):
            # "Provider errors" are described in the reference's prose only (shape and an
            # example, no status): the body follows the example, unchecked.
            return Answer(fault.status, {"error": {
                "code": fault.code, "message": fault.message or "Provider unavailable",
                "suggestion": "Try again shortly"}}, checked=False)
        return error_answer(method, path, fault.code, fault.message, fault.status)

    def invalid_answer(self, violations: list[Violation]) -> Answer:
        first = violations[0]
        if first.rule == "operation":
            return Answer(404, {"error": {"code": "global/object-does-not-exist",
                                          "message": f"No route {first.method} {first.path}."}})
        return Answer(400, {"error": {"code": "global/invalid-parameters",
                                      "message": f"{first.field}: {first.detail}"[:500]}})

    def not_found_answer(self, method: str, path: str) -> Answer:
        return Answer(404, raw=b"Not Found")

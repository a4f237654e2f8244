"""The fake Lambda API's wire protocol: errors as Lambda sends them, rate limits, injected faults
and the HTTP handler (only 127.0.0.1 is ever bound; see fake_api.py for the model behind it)."""

from __future__ import annotations

import base64
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

REGIONS = {
    "us-east-1": "Virginia, USA", "us-west-1": "California, USA", "us-west-2": "Arizona, USA",
    "us-south-1": "Texas, USA", "us-midwest-1": "Illinois, USA", "europe-central-1": "Germany",
    "asia-northeast-1": "Tokyo, Japan", "me-west-1": "Israel", "us-east-3": "Washington DC, USA",
}
ERRORS = {
    "global/invalid-api-key": (401, "API key was invalid, expired, or deleted.",
                               "Check your API key or create a new one, then try again."),
    "global/object-does-not-exist": (404, "Specified instance does not exist.", None),
    "global/invalid-parameters": (400, "Invalid request data.", None),
    "global/quota-exceeded": (400, "Quota exceeded.", "Contact Support to increase your quota."),
    "instance-operations/launch/insufficient-capacity": (
        400, "Not enough capacity to fulfill launch request.", None),
    "instance-operations/launch/file-system-in-wrong-region": (
        400, "File system is in a different region.", None),
    "global/too-many-requests": (429, "Too many requests.", "Slow down and try again."),
    "global/internal-error": (500, "An internal server error occurred.",
                              "Try again later. Contact Support if the problem persists."),
    "firewall-rulesets/firewall-ruleset-in-use": (
        400, "Firewall ruleset is in use by one or more instances.",
        "Terminate all instances that are using the ruleset before deleting it."),
}

class Reject(Exception):
    def __init__(self, code: str, message: str | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.message = message


@dataclass
class Fault:
    """Fail matching requests: `status` (429/500/503...) or `drop` (do the work, then close the
    connection without an answer). `times` requests are affected, after `skip` matching ones."""

    method: str
    path: str  # regex matched against the path after /api/v1
    status: int = 0
    drop: bool = False
    times: int = 1
    skip: int = 0
    retry_after: str | None = None


@dataclass
class Bucket:
    """Token bucket: `interval` seconds per token, at most `burst` tokens."""

    interval: float
    burst: float = 1.0
    tokens: float = 1.0
    updated: float = field(default_factory=time.monotonic)
    #: Accept a request this much (fraction of interval) early: clocks differ a little.
    tolerance: float = 0.01

    def take(self, now: float) -> bool:
        if self.interval <= 0:
            return True
        self.tokens = min(self.burst, self.tokens + (now - self.updated) / self.interval)
        self.updated = now
        if self.tokens >= 1.0 - self.tolerance:
            self.tokens -= 1.0
            return True
        return False



class HttpSide:
    """What `FakeLambda` gains: auth, fault injection and its request handler."""

    api_key: str
    faults: list[Fault]
    lock: threading.RLock
    general: Bucket
    launches: Bucket
    log: list[tuple[float, str, str, int]]

    def handle(self, method: str, path: str, body: Any) -> Any:
        raise NotImplementedError

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

    def _fault_for(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.method == method and re.fullmatch(fault.path, path):
                if fault.skip > 0:
                    fault.skip -= 1
                    return None
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                if not path.startswith("/api/v1/"):
                    return self._send(404, {"error": {"code": "global/object-does-not-exist",
                                                      "message": "Not found."}}, method, path)
                path = path[len("/api/v1"):]
                with fake.lock:
                    now = time.monotonic()
                    if not fake.authorized(self.headers.get("Authorization", "")):
                        return self._error("global/invalid-api-key", None, method, path)
                    fault = fake._fault_for(method, path)
                    if fault and fault.status:
                        extra = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                        code = "global/too-many-requests" if fault.status == 429 \
                            else "global/internal-error"
                        if fault.status in (502, 503):  # a load balancer's page, not JSON
                            return self._send(fault.status, None, method, path, extra,
                                              b"<html>Bad gateway</html>")
                        return self._error(code, None, method, path, fault.status, extra)
                    if not fake.general.take(now):
                        return self._error("global/too-many-requests", None, method, path)
                    is_launch = method == "POST" and path == "/instance-operations/launch"
                    if is_launch and not fake.launches.take(now):
                        fake.general.tokens += 1  # refused requests do not count
                        return self._error("global/too-many-requests", None, method, path)
                    try:
                        body = json.loads(raw) if raw else None
                    except ValueError:
                        return self._error("global/invalid-parameters", "Body is not JSON.",
                                           method, path)
                    try:
                        data = fake.handle(method, path, body)
                    except Reject as rej:
                        return self._error(rej.code, rej.message, method, path)
                    if fault and fault.drop:
                        fake.log.append((now, method, path, 0))
                        self.close_connection = True
                        self.connection.close()
                        return None
                    return self._send(200, {"data": data}, method, path)

            def _error(self, code: str, message: str | None, method: str, path: str,
                       status: int | None = None, headers: dict[str, str] | None = None) -> None:
                default_status, default_message, suggestion = ERRORS[code]
                error = {"code": code, "message": message or default_message}
                if suggestion:
                    error["suggestion"] = suggestion
                self._send(status or default_status, {"error": error}, method, path, headers)

            def _send(self, status: int, payload: Any, method: str, path: str,
                      headers: dict[str, str] | None = None, raw: bytes | None = None) -> None:
                fake.log.append((time.monotonic(), method, path, status))
                body = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html" if raw else "application/json")
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

        return Handler

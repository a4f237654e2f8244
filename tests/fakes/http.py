"""One base for the fakes of cloud HTTP APIs: a threaded werkzeug server on 127.0.0.1, routing by
the subclass, one fault type for injected errors, a request log, and a contract check both ways.

A fake subclasses `FakeHttpServer` and implements `handle()` (and, if its API has them, the
`authenticate`/`throttle`/`fault_answer`/`invalid_answer` hooks). A `Validator` (the API's own
published definition, e.g. `tests.fakes.openapi.OpenApiValidator`) checks every request before the
fake sees it and every answer before it is sent. A request the definition rejects is answered as
the real API would (`invalid_answer`); a request *or* answer that breaks the definition is also
recorded as a `Violation`, and the autouse fixture in tests/conftest.py fails the test that caused
it, naming the field and the rule. Only 127.0.0.1 is ever bound.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import re
import socket
import struct
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

#: The body of a request that is not JSON (the validator reports it as such).
NOT_JSON: Any = object()


@dataclass
class Fault:
    """Fail matching requests, `times` of them after `skip` matching ones.

    `status` with `code`: the API's documented error (body built by the fake from its definition).
    `status` alone: an undocumented failure (429 storm, 5xx, a load balancer's page), sent with a
    plain-text body, never an invented JSON shape. `drop`: do the work, then close the connection
    without an answer (a lost answer)."""

    method: str
    path: str  # regex matched against the path after the fake's prefix
    status: int = 0
    code: str | None = None
    drop: bool = False
    times: int = 1
    skip: int = 0
    retry_after: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Violation:
    """A request or answer that breaks the API's definition."""

    direction: str  # "request" or "response"
    method: str
    path: str
    field: str  # JSON path of the offending value, e.g. "$.tags[0].key"
    rule: str  # the schema keyword that failed (maxLength, required, enum, ...)
    detail: str

    def __str__(self) -> str:
        return (f"{self.direction} {self.method} {self.path}: {self.field} breaks {self.rule}: "
                f"{self.detail}")


@dataclass
class Answer:
    status: int
    payload: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: A non-JSON body (an undocumented failure); sent as text/plain and not validated.
    raw: bytes | None = None
    #: False for a JSON answer the definition describes only in prose (not validated).
    checked: bool = True


class Validator(Protocol):
    """The API's definition: which operations exist and what they accept and answer."""

    def check_request(self, method: str, path: str, query: dict[str, str],
                      body: Any) -> list[Violation]: ...

    def check_response(self, method: str, path: str, status: int, body: Any) -> list[Violation]: ...


#: The environ key of the moment a request reached the fake's socket (monotonic), see _QuietHandler.
ARRIVED = "rayfleet.arrived"
#: Linux's SO_TIMESTAMPNS (Python names it only on some builds).
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


class _QuietHandler(WSGIRequestHandler):
    """Also stamps each request with the moment its first byte reached the socket (the kernel's
    receive time): a real API's limits count a request when it reaches its front door, not when
    the server's code gets round to it. The fake runs in the tests' own process; on a loaded
    machine its threads wait seconds for a CPU and the GIL (measured: up to 2.5 s at load 10,
    bench/lambda_transit.py), a delay no real server would add to a client's request."""

    arrived: float | None = None

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass

    def handle_one_request(self) -> None:
        # Peeked before the request line is read: the clients here (requests) never pipeline,
        # so the reader's buffer is empty between requests and the next byte is still queued.
        self.arrived = self._first_byte_received()
        super().handle_one_request()

    def _first_byte_received(self) -> float | None:
        try:
            _, ancillary, _, _ = self.connection.recvmsg(1, socket.CMSG_SPACE(16), socket.MSG_PEEK)
        except (OSError, ValueError):
            return None
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= 16:
                seconds, nanoseconds = struct.unpack("qq", raw[:16])
                return seconds + nanoseconds / 1e9 - (time.time() - time.monotonic())
        return None

    def make_environ(self) -> Any:
        environ = super().make_environ()
        environ[ARRIVED] = self.arrived
        return environ


class _Dropped(ConnectionResetError):
    """Raised after shutting the socket: werkzeug treats it as a client that went away."""


class FakeHttpServer:
    """State lives in the subclass; every request runs under `self.lock`."""

    #: Every server alive, for the contract fixture (tests/conftest.py).
    live: ClassVar[weakref.WeakSet[FakeHttpServer]] = weakref.WeakSet()
    #: Path prefix of the API (e.g. "/api/v1"); logged paths and fault paths are below it.
    prefix: str = ""

    def __init__(self, validator: Validator | None = None, port: int = 0) -> None:
        self.validator = validator
        self.lock = threading.RLock()
        self.faults: list[Fault] = []
        #: (monotonic time it arrived, method, path, HTTP status; 0 = dropped) of every request,
        #: in the order they arrived.
        self.log: list[tuple[float, str, str, int]] = []
        self.violations: list[Violation] = []
        self._server: BaseWSGIServer = make_server("127.0.0.1", port, self._wsgi, threaded=True,
                                                   request_handler=_QuietHandler)
        # Accepted connections inherit it: even a new connection's first request is stamped.
        with contextlib.suppress(OSError):
            self._server.socket.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self._thread: threading.Thread | None = None
        FakeHttpServer.live.add(self)

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> FakeHttpServer:
        # Polled every 50 ms, not socketserver's 500: `stop` waits for the next poll, and a fake
        # stopped after each test cost the quick tier half a second of wall time per test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread (a CLI)."""
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- for tests ------------------------------------------------------------------------------

    def inject(self, *faults: Fault) -> None:
        with self.lock:
            self.faults.extend(faults)

    def requests(self, method: str | None = None, path: str | None = None) -> list[tuple[float, int]]:
        """(time, status) of logged requests matching method and path regex."""
        with self.lock:
            return [(t, s) for t, m, p, s in self.log
                    if (method is None or m == method) and (path is None or re.fullmatch(path, p))]

    def timeline(self) -> str:
        """The request log as the rate limits saw it, one request a line: seconds since the first
        request, gap to the previous one, method, path, status (0 = dropped). For a failing
        assertion's message, so that a timing failure explains itself."""
        with self.lock:
            log = list(self.log)
        start = previous = log[0][0] if log else 0.0
        lines = []
        for at, method, path, status in log:
            lines.append(f"{at - start:8.3f}s {at - previous:+7.3f}s {method} {path} {status}")
            previous = at
        return "fake's requests (at, gap, method, path, status):\n" + "\n".join(lines)

    def take_violations(self) -> list[Violation]:
        """The violations so far, forgetting them (a test that provokes one on purpose)."""
        with self.lock:
            taken, self.violations = self.violations, []
            return taken

    # --- hooks ----------------------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Any, request: Request) -> Answer:
        raise NotImplementedError

    def authenticate(self, request: Request) -> Answer | None:
        """An answer refusing the request's credentials, or None."""
        return None

    def throttle(self, method: str, path: str, now: float) -> Answer | None:
        """An answer refusing a request over the API's rate limit, or None."""
        return None

    def fault_answer(self, method: str, path: str, fault: Fault) -> Answer:
        if fault.code is not None:
            raise NotImplementedError(f"{type(self).__name__} cannot build error {fault.code}")
        return Answer(fault.status, raw=b"injected failure")

    def invalid_answer(self, violations: list[Violation]) -> Answer:
        """What the real API answers to a request its definition rejects."""
        return Answer(400, raw=b"; ".join(str(v).encode() for v in violations))

    def not_found_answer(self, method: str, path: str) -> Answer:
        return Answer(404, raw=b"not found")

    # --- machinery ------------------------------------------------------------------------------

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

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        method, full = request.method, request.path
        with self.lock:
            # One time per request: the rate limits judge it by this time and the log records
            # it, so gaps in the log are the gaps the limits saw. It is the moment the request
            # reached the socket (_QuietHandler), else the moment it got the lock.
            now = environ.get(ARRIVED) or time.monotonic()
            if not full.startswith(self.prefix + "/"):
                return self._send(self.not_found_answer(method, full), method, full, False, now)(
                    environ, start_response)
            path = full[len(self.prefix):]
            answer, validate, fault = self._answer(request, method, path, now)
            if fault is not None and fault.drop:
                self._log(now, method, path, 0)
                sock = environ.get("werkzeug.socket")
                if isinstance(sock, socket.socket):
                    sock.shutdown(socket.SHUT_RDWR)
                raise _Dropped("fault: connection dropped")
            return self._send(answer, method, path, validate, now)(environ, start_response)

    def _answer(self, request: Request, method: str, path: str,
                now: float) -> tuple[Answer, bool, Fault | None]:
        """The answer, whether it must match the definition, and the fault that applied."""
        refused = self.authenticate(request)
        if refused is not None:
            return refused, True, None
        fault = self._fault_for(method, path)
        if fault is not None and fault.status:
            answer = self.fault_answer(method, path, fault)
            if fault.retry_after:
                answer.headers["Retry-After"] = fault.retry_after
            return answer, fault.code is not None, fault
        refused = self.throttle(method, path, now)
        if refused is not None:
            return refused, refused.raw is None, fault
        raw = request.get_data()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = NOT_JSON
        if self.validator is not None:
            problems = self.validator.check_request(method, path, dict(request.args), body)
            if problems:
                self.violations.extend(problems)
                # Not checked again: the request's violation already fails the test.
                return self.invalid_answer(problems), False, fault
        return self.handle(method, path, body, request), True, fault

    def _log(self, now: float, method: str, path: str, status: int) -> None:
        # In the order requests arrived, which is not always the order they were served in.
        bisect.insort(self.log, (now, method, path, status))

    def _send(self, answer: Answer, method: str, path: str, validate: bool, now: float) -> Response:
        self._log(now, method, path, answer.status)
        if answer.raw is not None:
            return Response(answer.raw, answer.status, headers=answer.headers,
                            content_type="text/plain")
        if validate and answer.checked and self.validator is not None:
            self.violations.extend(
                self.validator.check_response(method, path, answer.status, answer.payload))
        return Response(json.dumps(answer.payload), answer.status, headers=answer.headers,
                        content_type="application/json")



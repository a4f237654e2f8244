"""The real gateway over real TLS in front of a recording upstream that stands where Ray's
dashboard would: what a member sends, byte for byte, and what reached "Ray"."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from infra.core.sharing import certs as sharing_certs
from infra.node import gateway_limits as gl
from infra.node import gateway_state as gs
from infra.node.gateway import Gateway, make_app, tls_context
from infra.node.gateway_config import Config
from tests.node import dashboard_fake

ANN, BO, OWNER, RAY = "t-ann", "t-bo", "t-owner", dashboard_fake.CLUSTER_TOKEN
IDS = {"ann": "a1a1a1a1a1a1a1a1", "bo": "b2b2b2b2b2b2b2b2"}
#: Ray's job list: one job of each member, one started inside the cluster with forged metadata.
JOBS: list[dict[str, Any]] = [{"submission_id": "raysubmit_ann1", "job_id": "01000000", "status": "RUNNING",
         "metadata": {"rayfleet_member": "ann"}},
        {"submission_id": "raysubmit_bo1", "job_id": "02000000", "status": "RUNNING",
         "metadata": {"rayfleet_member": "bo"}},
        {"submission_id": None, "job_id": "03000000", "status": "RUNNING",
         "metadata": {"rayfleet_member": "ann"}}]


@dataclass
class Upstream:
    """What reached "Ray": each request's method, raw path and query, and body."""

    seen: list[tuple[str, str, bytes]] = field(default_factory=list)
    packages: dict[str, bytes] = field(default_factory=dict)
    #: Ray's job list (JOBS at the start; a test adds or changes jobs here).
    jobs: list[dict[str, Any]] = field(default_factory=lambda: [dict(j) for j in JOBS])
    #: What "Ray" acted on: method, action (`/stop`, `/logs`, "" for DELETE) and the submission
    #: id of the job it resolved the request's id to.
    acted: list[tuple[str, str, str]] = field(default_factory=list)
    #: True: "Ray" is away (each connection dropped unanswered), as a head under load or restarting.
    away: bool = False
    #: Each request's method and path as it arrived, before its body was read (`seen` has it
    #: once read): a trickled upload is here while it holds its connection.
    arrived: list[tuple[str, str]] = field(default_factory=list)



def find_job_by_ids(jobs: list[dict[str, Any]], job_id: str) -> dict[str, Any] | None:
    """The job Ray's job API answers for `job_id`, in Ray's order (ray/dashboard/modules/job/
    utils.py `find_job_by_ids`): a driver started inside the cluster with that Ray job id, then
    a submission whose driver holds that Ray job id, and only then a submission of that id."""
    for found in (
            [j for j in jobs if not j["submission_id"] and j["job_id"] == job_id],
            [j for j in jobs if j["submission_id"] and j["job_id"] == job_id],
            [j for j in jobs if j["submission_id"] == job_id]):
        if found:
            return found[0]
    return None


@dataclass
class Bed:
    port: int
    ca: str
    upstream: Upstream
    gateway: Gateway
    loop: asyncio.AbstractEventLoop
    #: The client's TLS context, made once (loading the CA for each of a fuzz's thousand
    #: requests was a good part of its CPU).
    client_tls: ssl.SSLContext | None = None

    def on_gateway(self, coroutine: Any) -> Any:
        """Run `coroutine` (a gateway call of its own, as its tick makes) on the gateway's loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def send(self, method: str, target: str, token: str | None = ANN, body: bytes = b"",
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """One request, written byte for byte; the status and body of the answer."""
        status, _, rest = self.exchange(method, target, token, body, headers)
        return status, rest

    def exchange(self, method: str, target: str, token: str | None = ANN, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> tuple[int, list[str], bytes]:
        """As `send`, with the answer's header lines ("Name: value", as sent)."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{self.port}",
                 "Connection: close", f"Content-Length: {len(body)}"]
        if token:
            lines.append(f"Authorization: Bearer {token}")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if self.client_tls is None:
            self.client_tls = ssl.create_default_context(cafile=self.ca)
        context = self.client_tls
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
        head, _, rest = answer.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if b"transfer-encoding: chunked" in head.lower():
            rest = _unchunk(rest)
        return status, head.decode("latin-1").split("\r\n")[1:], rest


    def send_all(self, requests: list[tuple[str, str]], token: str | None = ANN) -> list[int]:
        """Each request's status, the requests (method, target) written byte for byte one after
        another on kept-alive connections, a new one whenever the gateway closes the last: a
        TLS handshake was nearly all the CPU of a request sent on a connection of its own."""
        statuses: list[int] = []
        tls: ssl.SSLSocket | None = None
        buffer = b""
        if self.client_tls is None:
            self.client_tls = ssl.create_default_context(cafile=self.ca)
        try:
            for method, target in requests:
                if tls is None:
                    raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                    tls, buffer = self.client_tls.wrap_socket(raw, server_hostname="127.0.0.1"), b""
                lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{self.port}",
                         "Content-Length: 0", *([f"Authorization: Bearer {token}"] if token else [])]
                tls.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
                status, closing, buffer = _answer(tls, buffer)
                statuses.append(status)
                if closing:
                    tls.close()
                    tls = None
        finally:
            if tls is not None:
                tls.close()
        return statuses


def _answer(tls: ssl.SSLSocket, buffer: bytes) -> tuple[int, bool, bytes]:
    """One answer read off a kept-alive connection (`buffer`: what was read past the last one):
    its status, whether the gateway closes the connection after it, and what was read past it."""
    def more(data: bytes) -> bytes:
        chunk = tls.recv(65536)
        if not chunk:
            raise ConnectionError(f"the gateway closed the connection mid-answer: {data[:200]!r}")
        return data + chunk

    while b"\r\n\r\n" not in buffer:
        buffer = more(buffer)
    head, _, buffer = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {name.strip().lower(): value.strip().lower()
              for name, _, value in (line.partition(":") for line in lines[1:])}
    status, closing = int(lines[0].split(" ", 2)[1]), fields.get("connection") == "close"
    if fields.get("transfer-encoding") == "chunked":
        size = -1
        while size != 0:  # each chunk: its size line, its bytes and CRLF; size 0 ends the body
            while b"\r\n" not in buffer:
                buffer = more(buffer)
            size = int(buffer.partition(b"\r\n")[0].split(b";")[0], 16)
            end = buffer.index(b"\r\n") + 2 + size + 2
            while len(buffer) < end:
                buffer = more(buffer)
            buffer = buffer[end:]
    elif "content-length" in fields:
        end = int(fields["content-length"])
        while len(buffer) < end:
            buffer = more(buffer)
        buffer = buffer[end:]
    else:  # the body runs to the connection's end
        while chunk := tls.recv(65536):
            buffer += chunk
        buffer, closing = b"", True
    return status, closing, buffer


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out


async def _tail(request: Any) -> Any:
    """Ray's log stream of a job: its first line, then quiet until the client goes (a long job)."""
    from aiohttp import web

    stream = web.WebSocketResponse()
    await stream.prepare(request)
    await stream.send_str("first line\n")
    async for _ in stream:
        pass
    return stream


def _members(data: Path) -> None:
    entries = {name: {"role": "member", "id": IDS[name], "token_sha256": gs.token_hash(token)}
               for name, token in (("ann", ANN), ("bo", BO))}
    (data / gs.MEMBERS_FILE).write_text(json.dumps(
        {"members": entries, "owner": {"token_sha256": gs.token_hash(OWNER)}}))


async def _upstream_app(upstream: Upstream) -> Any:
    from aiohttp import web

    async def record(request: web.Request) -> web.StreamResponse:
        upstream.arrived.append((request.method, request.path))
        body = await request.read()
        upstream.seen.append((request.method, request.raw_path, body))
        path = request.path
        if upstream.away:
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=503)  # never sent: the connection is gone
        if path.endswith("/logs/tail") and request.method == "GET":
            return await _tail(request)
        if path == "/api/jobs/" and request.method == "GET":
            return web.json_response(upstream.jobs)
        if path == "/api/jobs/" and request.method == "POST":
            submitted = json.loads(body)["submission_id"]  # Ray's answer: both names of the id
            return web.json_response({"job_id": submitted, "submission_id": submitted})
        if path == "/api/version":
            return web.json_response({"version": "4", "ray_version": "2.60.0",
                                      "ray_commit": "b7f4259e944bf6959f721b106adc366ddfa0c356"})
        if path.startswith("/api/jobs/"):
            job_id = path.split("/")[3]
            job = find_job_by_ids(upstream.jobs, job_id)
            if job is None:
                return web.Response(status=404, text=f"Job {job_id} does not exist")
            if path.count("/") == 3 and request.method == "GET":
                return web.json_response(job)
            if not job["submission_id"]:  # as Ray: its logs, stop and delete take submissions only
                return web.Response(status=400, text="Can only act on submission type jobs")
            upstream.acted.append((request.method, path[len(f"/api/jobs/{job_id}"):],
                                   job["submission_id"]))
            return web.json_response(job if path.count("/") == 3 else {"ok": True})
        if path.startswith("/api/packages/"):
            name = path.rsplit("/", 1)[1]
            if request.method == "PUT":
                upstream.packages[name] = body  # Ray's own PUT overwrites: the gateway must not
                return web.Response(text="ok")
            return web.Response(status=200 if name in upstream.packages else 404)
        found = dashboard_fake.answer(path, request.query)
        if found is not None:
            status, answer = found
            if isinstance(answer, str):
                return web.Response(status=status, text=answer)
            return web.json_response(answer, status=status)
        return web.Response(text=f"ray's answer to {path}")

    app = web.Application(client_max_size=1024 ** 3)
    app.router.add_route("*", "/{tail:.*}", record)
    return app


@contextlib.contextmanager
def gateway_bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> Iterator[Bed]:
    """The bed, its gateway's Config fields overridden by `config`."""
    from aiohttp import web

    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "home"))
    cert, key = sharing_certs.ensure_server_cert("class", ["127.0.0.1"])
    token = tmp_path / "ray-token"
    token.write_text(RAY)
    data = tmp_path / "gateway"
    data.mkdir()
    _members(data)
    upstream = Upstream()
    loop = asyncio.new_event_loop()
    ready: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(await _upstream_app(upstream))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ray_port = runner.addresses[0][1]
        config = Config(cluster="class", host="127.0.0.1", port=0,
                        upstream=f"http://127.0.0.1:{ray_port}", token_path=str(token),
                        cert=str(cert), key=str(key), data_dir=str(data),
                        **{"poll_seconds": 3600, "max_upload_mb": 1, "max_member_upload_mb": 2,
                           **overrides})
        gateway = Gateway(config)
        # Served as `serve` serves it: with the limits on connections (gateway_limits).
        front = await gl.listen(make_app(gateway), gateway.doorman, "127.0.0.1", 0,
                                tls_context(str(cert), str(key)))
        gateway.usage.note("raysubmit_ann1", member="ann", member_id=IDS["ann"])
        gateway.usage.note("raysubmit_bo1", member="bo", member_id=IDS["bo"])
        ready.update(runners=(front, runner), port=front.port, gateway=gateway)

    loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield Bed(ready["port"], str(sharing_certs.ca_cert_path("class")), upstream,
                  ready["gateway"], loop)
    finally:
        async def stop() -> None:
            for runner in ready["runners"]:
                await runner.cleanup()
            # What a test left open (a connection past the gateway's shutdown timeout) ends here,
            # not as "Task was destroyed but it is pending!" when the loop closes.
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)


        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

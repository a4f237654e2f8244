"""The gateway against a member who sends any bytes: a recording upstream stands where Ray's
dashboard would, behind the real gateway over real TLS, and sees only what the rules authorized.

Requests are written byte for byte on a TLS socket (a client library would normalize them first,
which is exactly what an attacker does not do)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from infra import sharing_certs
from infra.node import gateway_packages as gk
from infra.node import gateway_state as gs
from infra.node.gateway import Gateway, make_app
from infra.node.gateway_config import Config

ANN, BO, OWNER, RAY = "t-ann", "t-bo", "t-owner", "the-cluster-ray-token"
IDS = {"ann": "a1a1a1a1a1a1a1a1", "bo": "b2b2b2b2b2b2b2b2"}
#: Paths a member's request may reach Ray at (the rules' allow list, written out again here).
_OWN = "|".join(IDS.values())
ALLOWED = re.compile(
    r"/api/jobs/(?:[A-Za-z0-9_-]{1,64}(?:/logs|/stop)?)?"
    rf"|/api/packages/gcs/_ray_pkg_rf(?:{_OWN})_[0-9a-f]{{16,64}}\.zip"
    r"|/api/version|/api/authentication_mode|/|/index\.html|/favicon\.ico|/logo\.svg|/timezone"
      r"|/nodes|/api/cluster_status|/api/grafana_health|/api/prometheus_health"
      r"|/api/v0/cluster_metadata|/static/[A-Za-z0-9_.~/-]+")
#: Ray's job list: one job of each member, one started inside the cluster with forged metadata.
JOBS = [{"submission_id": "raysubmit_ann1", "job_id": "01000000", "status": "RUNNING",
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


@dataclass
class Bed:
    port: int
    ca: str
    upstream: Upstream
    gateway: Gateway

    def send(self, method: str, target: str, token: str | None = ANN, body: bytes = b"",
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """One request, written byte for byte; the status and body of the answer."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{self.port}",
                 "Connection: close", f"Content-Length: {len(body)}"]
        if token:
            lines.append(f"Authorization: Bearer {token}")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        context = ssl.create_default_context(cafile=self.ca)
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
        return status, rest


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out


def _members(data: Path) -> None:
    entries = {name: {"role": "member", "id": IDS[name], "token_sha256": gs.token_hash(token)}
               for name, token in (("ann", ANN), ("bo", BO))}
    (data / gs.MEMBERS_FILE).write_text(json.dumps(
        {"members": entries, "owner": {"token_sha256": gs.token_hash(OWNER)}}))


async def _upstream_app(upstream: Upstream) -> Any:
    from aiohttp import web

    async def record(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        upstream.seen.append((request.method, request.raw_path, body))
        path = request.path
        if path == "/api/jobs/" and request.method == "GET":
            return web.json_response(JOBS)
        if path == "/api/jobs/" and request.method == "POST":
            return web.json_response({"submission_id": json.loads(body)["submission_id"]})
        if path.startswith("/api/jobs/"):
            job = path.split("/")[3]
            found = [j for j in JOBS if j["submission_id"] == job]
            if not found:
                return web.Response(status=404, text=f"Job {job} does not exist")
            return web.json_response(found[0] if path.count("/") == 3 else {"ok": True})
        if path.startswith("/api/packages/"):
            name = path.rsplit("/", 1)[1]
            if request.method == "PUT":
                upstream.packages[name] = body  # Ray's own PUT overwrites: the gateway must not
                return web.Response(text="ok")
            return web.Response(status=200 if name in upstream.packages else 404)
        return web.Response(text=f"ray's answer to {path}")

    app = web.Application(client_max_size=1024 ** 3)
    app.router.add_route("*", "/{tail:.*}", record)
    return app


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
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
                        cert=str(cert), key=str(key), data_dir=str(data), poll_seconds=3600,
                        max_upload_mb=1, max_member_upload_mb=2)
        gateway = Gateway(config)
        front = web.AppRunner(make_app(gateway))
        await front.setup()
        from infra.node.gateway import tls_context

        await web.TCPSite(front, "127.0.0.1", 0, ssl_context=tls_context(str(cert),
                                                                         str(key))).start()
        gateway.usage.note("raysubmit_ann1", member="ann", member_id=IDS["ann"])
        gateway.usage.note("raysubmit_bo1", member="bo", member_id=IDS["bo"])
        ready.update(runners=(front, runner), port=front.addresses[0][1], gateway=gateway)

    loop.run_until_complete(start())
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield Bed(ready["port"], str(sharing_certs.ca_cert_path("class")), upstream,
                  ready["gateway"])
    finally:
        async def stop() -> None:
            for runner in ready["runners"]:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


#: Every way of writing a dot segment, a separator or an escape that a path may carry.
TRICKS = ["..", ".", "%2E%2E", "%2e%2e", ".%2E", "%2E.", "%252E%252E", "%2E", "..%2F..", "%2F",
          "%2f", "", ";", "..;", "\\..", "%5C..", "%5c", "%3F", "%3f", "%23", "%25", "%00",
          "%2E%2E%2F", "..%252F", "%C0%AE%C0%AE", "...."]
#: Where a member is allowed something, so that a trick there could reach elsewhere.
BASES = ["/static/{t}/api/jobs/", "/static/js/{t}/{t}/api/v0/tasks", "/api/jobs/{t}/logs",
         "/api/jobs/raysubmit_ann1/{t}/{t}/raysubmit_bo1/logs", "/api/packages/gcs/{t}/x.zip",
         "/api/packages/gcs/_ray_pkg_0123456789abcdef{t}.zip", "/nodes/{t}/api/jobs/", "/{t}/api/jobs/",
         "/api/jobs/{t}", "/api/jobs/{t}?x=1", "/api/version/{t}/api/jobs/"]


def _fuzz_targets() -> list[str]:
    return [base.replace("{t}", trick) for base in BASES for trick in TRICKS]


def test_the_upstream_sees_only_allow_listed_paths_whatever_a_member_sends(bed: Bed) -> None:
    statuses: dict[str, int] = {}
    for target in _fuzz_targets():
        for method in ("GET", "POST", "PUT", "DELETE"):
            statuses[f"{method} {target}"] = bed.send(method, target)[0]
    reached = [(m, p) for m, p, _ in bed.upstream.seen]
    wrong = [(m, p) for m, p in reached if not ALLOWED.fullmatch(p.partition("?")[0])]
    assert wrong == [], wrong
    # Nothing that reached Ray holds a dot segment, an escape or an empty segment.
    assert not [p for _, p in reached if re.search(r"/\.\.?(/|$)|%|//|;|\\", p)]
    # Dot segments in any encoding are refused before any rule, never collapsed into another path.
    assert statuses["GET /static/%2E%2E/api/jobs/"] == 400
    assert statuses["GET /static/../api/jobs/"] == 400
    assert statuses["GET /api/jobs/raysubmit_ann1/../../raysubmit_bo1/logs"] == 400
    # Ray's job list itself is asked by the gateway (filtered), never forwarded for a trick.
    listed = [p for m, p, _ in bed.upstream.seen if m == "GET" and p == "/api/jobs/"]
    assert len(listed) == sum(1 for k, v in statuses.items() if v == 200 and k.startswith(
        "GET ") and k.split(" ", 1)[1].partition("?")[0] in ("/api/jobs/", "/api/jobs"))


def test_a_submission_id_that_is_not_a_plain_name_is_refused(bed: Bed) -> None:
    for job in ("x?y", "a/../raysubmit_bo1", "x y", "x#y", "é", "a" * 65, 7):
        body = json.dumps({"entrypoint": "python -c 1", "submission_id": job}).encode()
        status, text = bed.send("POST", "/api/jobs/", body=body)
        assert (status, job) == (400, job) and b"submission_id" in text
    for target in ("/api/jobs/x%3Fy/stop", "/api/jobs/x%20y", "/api/jobs/" + "a" * 65 + "/logs"):
        assert bed.send("POST" if target.endswith("stop") else "GET", target)[0] == 400
    assert not [p for m, p, _ in bed.upstream.seen if m == "POST"]


def test_the_cluster_token_is_nobody_at_the_gateway(bed: Bed) -> None:
    for headers in ({"Authorization": f"Bearer {RAY}"}, {"X-Ray-Authorization": RAY},
                    {"Cookie": f"ray-authentication-token={RAY}"}):
        status, text = bed.send("GET", "/api/jobs/", token=None, headers=headers)
        assert status == 403 and b"unknown or revoked token" in text
    # The owner's own gateway token sees every job, the one started inside the cluster included.
    status, text = bed.send("GET", "/api/jobs/", token=OWNER)
    assert status == 200 and len(json.loads(text)) == 3


def test_a_member_sees_only_jobs_the_gateway_recorded_as_theirs(bed: Bed) -> None:
    status, text = bed.send("GET", "/api/jobs/")
    # The job started inside the cluster claims ann in its metadata: not evidence, not shown.
    assert status == 200 and [j["submission_id"] for j in json.loads(text)] == ["raysubmit_ann1"]
    # Another member's job is answered as Ray answers a job that does not exist.
    for method, target in (("GET", "/api/jobs/raysubmit_bo1"), ("GET", "/api/jobs/raysubmit_bo1/logs"),
                           ("POST", "/api/jobs/raysubmit_bo1/stop"),
                           ("DELETE", "/api/jobs/raysubmit_bo1")):
        status, text = bed.send(method, target)
        assert (status, text.strip()) == (404, b"Job raysubmit_bo1 does not exist")
    assert not [p for _, p, _ in bed.upstream.seen if "raysubmit_bo1" in p]


def test_a_member_cannot_replace_or_read_another_members_package(bed: Bed) -> None:
    name = "_ray_pkg_0123456789abcdef.zip"
    assert bed.send("PUT", f"/api/packages/gcs/{name}", token=BO, body=b"bo's starter")[0] == 200
    # ann asks for the same name: she does not see bo's, so her client uploads her own...
    assert bed.send("GET", f"/api/packages/gcs/{name}")[0] == 404
    assert bed.send("PUT", f"/api/packages/gcs/{name}", body=b"ann's code")[0] == 200
    # ...and a second PUT over a package that exists is refused, bo's own included.
    status, text = bed.send("PUT", f"/api/packages/gcs/{name}", token=BO, body=b"evil")
    assert status == 409 and b"never replaced" in text
    assert bed.upstream.packages == {gk.scoped(IDS["bo"], name): b"bo's starter",
                                     gk.scoped(IDS["ann"], name): b"ann's code"}
    # A submit names the member's own package, whatever URI it sends.
    body = json.dumps({"entrypoint": "python x.py",
                       "runtime_env": {"working_dir": f"gcs://{name}"}}).encode()
    assert bed.send("POST", "/api/jobs/", body=body)[0] == 200
    sent = json.loads([b for m, p, b in bed.upstream.seen if m == "POST"][-1])
    assert sent["runtime_env"]["working_dir"] == f"gcs://{gk.scoped(IDS['ann'], name)}"


def test_an_upload_past_its_cap_is_refused_and_nothing_is_stored(bed: Bed) -> None:
    status, text = bed.send("PUT", "/api/packages/gcs/_ray_pkg_0123456789abcdef00.zip",
                            body=b"x" * (1024 ** 2 + 1))
    assert status == 413 and b"sharing.max_upload_mb" in text
    assert bed.upstream.packages == {}


def test_a_member_may_not_set_how_ray_stops_their_job(bed: Bed) -> None:
    for name in ("RAY_JOB_STOP_WAIT_TIME_S", "RAY_JOB_STOP_SIGNAL", "ray_job_stop_wait_time_s"):
        body = json.dumps({"entrypoint": "python x.py",
                           "runtime_env": {"env_vars": {name: "1000000000"}}}).encode()
        status, text = bed.send("POST", "/api/jobs/", body=body)
        assert status == 400 and name.encode() in text
    assert not [p for m, p, _ in bed.upstream.seen if m == "POST"]


def test_every_audit_line_names_its_source_address(bed: Bed) -> None:
    bed.send("GET", "/api/jobs/", token=None)  # 401
    bed.send("GET", "/api/jobs/", token="wrong")  # 403
    bed.send("GET", "/static/%2E%2E/x")  # 400
    bed.send("GET", "/api/jobs/")  # 200
    lines = [json.loads(line) for line in
             (Path(bed.gateway.config.data_dir) / gs.AUDIT_FILE).read_text().splitlines()]
    assert [line["status"] for line in lines] == [401, 403, 400, 200]
    assert {line["source"] for line in lines} == {"127.0.0.1"}

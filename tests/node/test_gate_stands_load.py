"""Issue 47, high: one member cannot take the gateway from the others. The real gateway over TLS
before a fake Ray (tests/node/gateway_bed.py), on loopback: one member holds 100 trickled uploads
or 100 log tails open, and another member's requests stay within 2x an unloaded baseline
measured in the same test; each cap answers 429 naming its spec key; a stalled upload is cut.

Before the caps, 100 such streams took every connection of the gateway's one pool to Ray: the
other member's request then waited for a free one (two minutes), so each test here fails on its
10 s socket timeout against that code.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.node import gateway_limits as gl
from tests.node.gateway_bed import ANN, BO, Bed, gateway_bed
from tests.waiting import wait_until

#: Requests of the other member per measurement; the p95 of 30 is their second slowest.
SAMPLES = 30


def _p95(bed: Bed) -> float:
    """The 95th percentile of SAMPLES of bo's job list, each on a new TLS connection."""
    times = []
    for _ in range(SAMPLES):
        started = time.monotonic()
        status, _ = bed.send("GET", "/api/jobs/", token=BO)
        times.append(time.monotonic() - started)
        assert status == 200
    return sorted(times)[int(0.95 * SAMPLES) - 1]


def _within_twice(baseline: float, loaded: float) -> None:
    # A floor of 50 ms: a few-ms baseline doubles with two busy cores' scheduling alone. What the
    # old code did is a 10 s timeout (the socket's), far beyond either bound.
    assert loaded <= max(2 * baseline, baseline + 0.05), (baseline, loaded)


def _tls(bed: Bed) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=bed.ca)
    raw = socket.create_connection(("127.0.0.1", bed.port), timeout=10)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


@contextlib.contextmanager
def _trickled_puts(bed: Bed, count: int, token: str = ANN) -> Iterator[list[ssl.SSLSocket]]:
    """`count` uploads of 500 kB by one member, each sending its headers and one byte, then
    nothing more while held."""
    held: list[ssl.SSLSocket] = []
    try:
        for i in range(count):
            tls = _tls(bed)
            held.append(tls)
            tls.sendall((f"PUT /api/packages/gcs/_ray_pkg_{i:016x}.zip HTTP/1.1\r\n"
                         f"Host: 127.0.0.1:{bed.port}\r\nAuthorization: Bearer {token}\r\n"
                         "Content-Type: application/zip\r\nContent-Length: 500000\r\n\r\nP"
                         ).encode())
        yield held
    finally:
        for tls in held:
            with contextlib.suppress(OSError):
                tls.close()


def test_a_hundred_trickled_uploads_of_one_member_leave_another_member_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with gateway_bed(tmp_path, monkeypatch) as bed:
        baseline = _p95(bed)
        with _trickled_puts(bed, 100):
            # Every upload answered or streaming before bo is measured: 2 stream (the cap).
            wait_until(lambda: bed.gateway.caps.held.get((gl.UPLOADS, "a1a1a1a1a1a1a1a1")) == 2
                       or None, "ann's two uploads streaming", timeout=30, interval=0.05)
            loaded = _p95(bed)
        _within_twice(baseline, loaded)


def test_the_upload_cap_answers_429_naming_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with gateway_bed(tmp_path, monkeypatch) as bed, _trickled_puts(bed, 2):
        wait_until(lambda: bed.gateway.caps.held.get((gl.UPLOADS, "a1a1a1a1a1a1a1a1")) == 2
                   or None, "ann's two uploads streaming", timeout=30, interval=0.05)
        status, body = bed.send("PUT", f"/api/packages/gcs/_ray_pkg_{'f' * 16}.zip", body=b"x")
        assert status == 429 and b"sharing.max_member_uploads" in body, body
        assert body.count(b"\n") == 1
        # Another member's upload is theirs to make.
        assert bed.send("PUT", f"/api/packages/gcs/_ray_pkg_{'e' * 16}.zip", token=BO,
                        body=b"x")[0] == 200


def test_a_stalled_upload_is_cut_and_frees_its_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gl, "UPLOAD_IDLE_S", 1.0)
    with gateway_bed(tmp_path, monkeypatch) as bed, _trickled_puts(bed, 1) as held:
        held[0].settimeout(10)
        answer = held[0].recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"sent nothing for 1 s" in answer
        wait_until(lambda: (gl.UPLOADS, "a1a1a1a1a1a1a1a1") not in bed.gateway.caps.held or None,
                   "the upload's place freed", timeout=10, interval=0.05)


def test_the_connection_cap_answers_429_naming_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with gateway_bed(tmp_path, monkeypatch, max_member_connections=3) as bed, \
            _trickled_puts(bed, 3):
        wait_until(lambda: bed.gateway.caps.held.get((gl.CONNECTIONS, "a1a1a1a1a1a1a1a1")) == 3
                   or None, "ann's three connections", timeout=30, interval=0.05)
        status, body = bed.send("GET", "/api/jobs/")
        assert status == 429 and b"sharing.max_member_connections" in body, body
        assert bed.send("GET", "/api/jobs/", token=BO)[0] == 200


async def _open_tails(bed: Bed, count: int) -> tuple[Any, list[Any], int]:
    """`count` log tails of ann's job held open (the session and the open ones); how many were
    refused."""
    from aiohttp import ClientSession, WSServerHandshakeError

    session = ClientSession()
    context = ssl.create_default_context(cafile=bed.ca)
    url = f"https://127.0.0.1:{bed.port}/api/jobs/raysubmit_ann1/logs/tail"

    async def one() -> Any:
        try:
            stream = await session.ws_connect(url, ssl=context,
                                              headers={"Authorization": f"Bearer {ANN}"})
        except WSServerHandshakeError as exc:
            assert exc.status == 429, exc
            return None
        first = await stream.receive(timeout=10)
        assert first.data == "first line\n"
        return stream

    opened = await asyncio.gather(*(one() for _ in range(count)))
    held = [s for s in opened if s is not None]
    return session, held, count - len(held)


def test_a_hundred_log_tails_of_one_member_leave_another_member_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=60)

    try:
        with gateway_bed(tmp_path, monkeypatch) as bed:
            baseline = _p95(bed)
            session, held, refused = on_loop(_open_tails(bed, 100))
            try:
                assert len(held) == 4 and refused == 96, (len(held), refused)
                loaded = _p95(bed)
                # Past the cap, one line naming the key.
                status, body = bed.send("GET", "/api/jobs/raysubmit_ann1/logs/tail",
                                        headers={"Upgrade": "websocket",
                                                 "Connection": "Upgrade",
                                                 "Sec-WebSocket-Version": "13",
                                                 "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
                assert status == 429 and b"sharing.max_member_tails" in body, body
            finally:
                on_loop(session.close())
            _within_twice(baseline, loaded)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

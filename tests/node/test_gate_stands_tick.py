"""Issue 47: the gateway's enforcement outlasts whatever happens to a tick. A tick that raises is
said in one line and tried again (before: the first error ended the watcher task, silently, and
every limit with it); while Ray is away members get 502 and the ticks go on, catching up when it
is back (before: a 500, and `sys.exit(0)` after two minutes, which the supervisor took for done);
and the tick's calls to Ray never wait behind members' streams (its own session).

The real gateway over TLS before a fake Ray (tests/node/gateway_bed.py), ticking every 0.2 s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from infra.node import gateway_limits as gl
from infra.node import gateway_stops as stops
from tests.node import gateway_bed as bed_module
from tests.node.gateway_bed import BO, gateway_bed
from tests.waiting import wait_until

TICKING = {"poll_seconds": 0.2, "max_job_hours": 1.0}
STOP_ANN = ("POST", "/stop", "raysubmit_ann1")


def _two_hours_ago() -> float:
    return (time.time() - 2 * 3600) * 1000  # Ray's times are in ms


def _asked_for_jobs(bed: bed_module.Bed) -> int:
    return sum(1 for method, path, _ in list(bed.upstream.seen)
               if method == "GET" and path == "/api/jobs/")


def test_a_tick_that_raises_is_said_and_the_next_one_still_stops_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """ann's job has run 2 h of sharing.max_job_hours 1: the first tick's enforcement raises,
    the next stops the job."""
    monkeypatch.setitem(bed_module.JOBS[0], "start_time", _two_hours_ago())
    real, calls = stops.enforce_hours, []

    async def fails_once(*args: Any) -> None:
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("a bug in one tick")
        await real(*args)

    monkeypatch.setattr(stops, "enforce_hours", fails_once)
    with gateway_bed(tmp_path, monkeypatch, **TICKING) as bed:
        wait_until(lambda: STOP_ANN in bed.upstream.acted or None,
                   "ann's job stopped after a tick raised", timeout=20, interval=0.05)
        assert len(calls) >= 2
    said = capsys.readouterr().out
    assert "gateway: a tick failed (RuntimeError: a bug in one tick); trying again in 0.2 s" \
        in said, said


def test_while_ray_is_away_members_get_502_and_the_ticks_go_on_and_catch_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with gateway_bed(tmp_path, monkeypatch, **TICKING) as bed:
        wait_until(lambda: bed.gateway.ticked or None, "a first tick", timeout=20, interval=0.05)
        bed.upstream.away = True
        status, body = bed.send("GET", "/api/jobs/", token=BO)
        assert status == 502, (status, body)
        assert body.startswith(b"the cluster's Ray did not answer") and body.count(b"\n") == 1
        asked = _asked_for_jobs(bed)
        wait_until(lambda: _asked_for_jobs(bed) >= asked + 3 or None,
                   "three more ticks while Ray is away", timeout=20, interval=0.05)
        # Meanwhile ann's job passes sharing.max_job_hours: the first tick Ray answers stops it.
        bed.upstream.jobs[0]["start_time"] = _two_hours_ago()
        assert STOP_ANN not in bed.upstream.acted
        bed.upstream.away = False
        wait_until(lambda: STOP_ANN in bed.upstream.acted or None,
                   "ann's job stopped once Ray is back", timeout=20, interval=0.05)
        assert bed.send("GET", "/api/jobs/", token=BO)[0] == 200
    said = capsys.readouterr().out
    assert "answered 0; members get 502 until it answers, ticks go on" in said, said
    assert "answered 200 again; ticks catch up" in said, said


def test_the_ticks_calls_do_not_wait_behind_members_streams(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The members' pool to Ray made 2 connections, both held by trickled uploads (ann's and
    bo's): the tick still reaches Ray and stops bo's job once it is past its hours."""
    from tests.node.test_gate_stands_load import _trickled_puts

    monkeypatch.setattr(gl, "MEMBER_POOL", 2)
    with gateway_bed(tmp_path, monkeypatch, **TICKING) as bed, _trickled_puts(bed, 1), \
            _trickled_puts(bed, 1, token=BO):
        wait_until(lambda: sum(1 for m, _ in list(bed.upstream.arrived) if m == "PUT") == 2
                   or None, "both uploads holding a connection to Ray", timeout=30, interval=0.05)
        bed.upstream.jobs[1]["start_time"] = _two_hours_ago()
        wait_until(lambda: ("POST", "/stop", "raysubmit_bo1") in bed.upstream.acted or None,
                   "bo's job stopped by a tick while the members' pool is full", timeout=20,
                   interval=0.05)

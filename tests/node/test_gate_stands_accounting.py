"""Accounting that adds up: the gateway's ticks (the real gateway, a recording upstream standing
where Ray's dashboard would) charge a job Ray deleted between two ticks once, close one deleted
while it ran, split the cluster's price by the resources each job held, and charge what a job
left behind to its member."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.node import gateway_state as gs
from tests.node import gateway_bed
from tests.node.gateway_bed import ANN, IDS, Bed

#: $1 a second: what a few seconds of a job cost is plain to see.
PRICE = 3600.0


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed.gateway_bed(tmp_path, monkeypatch, price_per_hour=PRICE) as started:
        yield started


def _tick(bed: Bed) -> None:
    assert bed.on_gateway(bed.gateway.account()) == 200


def _submit(bed: Bed, job: str) -> None:
    body = json.dumps({"entrypoint": "python quick.py", "submission_id": job}).encode()
    assert bed.send("POST", "/api/jobs/", token=ANN, body=body)[0] == 200


def test_a_job_that_ran_and_was_deleted_between_two_ticks_is_charged_once(bed: Bed) -> None:
    """ann's job runs a second and is deleted before any tick lists it: the first tick after a
    list could have shown it closes it with the time from its submit, once."""
    _submit(bed, "quick")
    _tick(bed)  # its list may have been asked for before the submit: not yet judged
    assert bed.gateway.usage.jobs["quick"].status is None
    _tick(bed)
    entry = dataclasses.replace(bed.gateway.usage.jobs["quick"])
    assert entry.status == "DELETED" and entry.cost > 0
    hours = gs.job_hours(entry)
    assert entry.end_time is not None and entry.start_time is not None
    assert hours > 0 and entry.end_time >= entry.start_time
    _tick(bed)
    _tick(bed)
    again = bed.gateway.usage.jobs["quick"]
    assert again.cost == entry.cost and gs.job_hours(again) == hours
    cluster = bed.gateway.usage.cluster
    member_costs = sum(float(e.cost) for e in bed.gateway.usage.jobs.values())
    # Within the rounding of epoch seconds (a microsecond is a microdollar here).
    assert member_costs + cluster.owner_usd + cluster.idle_usd == pytest.approx(
        cluster.accrued_usd, abs=1e-5)


def test_a_job_deleted_after_a_tick_saw_it_running_gets_an_end(bed: Bed) -> None:
    """Seen RUNNING, then gone from Ray's list: its hours end at the tick that found it gone,
    instead of growing for ever."""
    jobs: list[dict[str, Any]] = bed.upstream.jobs
    started_ms = (bed.gateway.usage.jobs["raysubmit_ann1"].noted_at or 0) * 1000
    jobs[0] = {**jobs[0], "start_time": started_ms}
    _tick(bed)
    entry = bed.gateway.usage.jobs["raysubmit_ann1"]
    assert entry.status == "RUNNING" and entry.end_time is None
    del jobs[0]  # ann deleted it (it ended first: Ray deletes only finished jobs)
    _tick(bed)
    entry = bed.gateway.usage.jobs["raysubmit_ann1"]
    assert entry.status == "DELETED" and isinstance(entry.end_time, float)
    later = entry.end_time + 3.6e6 * 24  # a day later, the same hours
    assert gs.job_hours(entry, now_ms=later) == gs.job_hours(entry)
    assert bed.gateway.usage.maybe_active(IDS["ann"]) == 0


def _usage(tmp_path: Path, **members: str) -> gs.Usage:
    usage = gs.Usage(tmp_path / gs.USAGE_FILE)
    for key, member in members.items():
        usage.note(key, member=member, member_id=f"id-{member}")
    return usage


def test_the_price_is_split_by_the_resources_each_job_held(tmp_path: Path) -> None:
    """An hour at $18/h: ann's 1-GPU job weighs 16 CPUs, bo's 1-CPU job 1, the owner's job
    that reserved nothing its driver's 1: $16, $1 and $1. Then ann's job ends and leaves a
    detached actor holding 2 CPUs: it is charged as running (hours and cost) by that weight."""
    usage = _usage(tmp_path, a="ann", b="bo")
    hour = 3_600_000
    jobs = [{"submission_id": "a", "job_id": "01000000", "status": "RUNNING", "start_time": 0,
             "entrypoint_num_gpus": 1},
            {"submission_id": "b", "job_id": "02000000", "status": "RUNNING", "start_time": 0,
             "entrypoint_num_cpus": 1},
            {"submission_id": "o", "job_id": "03000000", "status": "RUNNING", "start_time": 0}]
    usage.tick(jobs, 3600, 18.0, now=3600)
    assert usage.jobs["a"].cost == pytest.approx(16.0)
    assert usage.jobs["b"].cost == pytest.approx(1.0)
    assert usage.cluster.owner_usd == pytest.approx(1.0)
    # ann's job ended at 1 h and is deleted; its actor (2 CPUs) lives on beside bo's job.
    jobs = [{**jobs[1]}]
    usage.jobs["a"].update(status="SUCCEEDED", end_time=hour)
    usage.holdings = {"01000000": 2.0}
    usage.tick(jobs, 3600, 3.0, now=7200)
    assert usage.jobs["a"].cost == pytest.approx(16.0 + 2.0)
    assert usage.jobs["b"].cost == pytest.approx(1.0 + 1.0)
    assert gs.job_hours(usage.jobs["a"]) == pytest.approx(2.0)
    usage.holdings = {}  # reaped: ann's job is charged no more
    usage.tick(jobs, 3600, 3.0, now=10800)
    assert usage.jobs["a"].cost == pytest.approx(18.0)
    assert gs.job_hours(usage.jobs["a"], now_ms=10 * hour) == pytest.approx(2.0)
    usage.save()
    assert gs.Usage(tmp_path / gs.USAGE_FILE).jobs["a"].cost == pytest.approx(18.0)


def test_a_usage_file_of_the_old_shape_loads_and_goes_on(tmp_path: Path) -> None:
    """A file written before deletions were closed: a job recorded RUNNING that Ray no longer
    lists is closed at the next tick, and its cost so far is kept."""
    path = tmp_path / gs.USAGE_FILE
    path.write_text(json.dumps({
        "cluster": {"accrued_usd": 2.0, "hourly_usd": 1.0, "idle_usd": 0.0, "owner_usd": 0.0},
        "jobs": {"old": {"cost": 2.0, "member": "ann", "member_id": "id-ann",
                         "status": "RUNNING", "start_time": 0, "end_time": None}},
        "members": {"ann": {"last_seen": "2026-01-01T00:00:00+00:00"}}, "uploads": {"id-ann": 5}}))
    usage = gs.Usage(path)
    usage.tick([], 3600, 1.0, now=3 * 3600)
    entry = usage.jobs["old"]
    assert entry.status == "DELETED" and entry.cost == pytest.approx(3.0)
    assert gs.job_hours(entry, now_ms=1e12) == pytest.approx(3.0)
    assert usage.uploaded("id-ann") == 5

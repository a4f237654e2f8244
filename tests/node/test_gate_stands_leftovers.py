"""What finished jobs left alive, as the real gateway's tick sees it in Ray's state API (a recording
upstream stands where Ray's dashboard would, with one live actor per Ray job id: ann's 01000000,
bo's 02000000, a driver's started inside the cluster 03000000): which leftovers one reaper job is
started for, and when (gateway_leftovers.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.node import gateway_state as gs
from tests.node import gateway_bed
from tests.node.gateway_bed import Bed


@pytest.fixture
def beds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def make(**config: Any) -> Any:
        return gateway_bed.gateway_bed(tmp_path, monkeypatch, **config)
    yield make


def _end(bed: Bed, *jobs: str, started_s_ago: float = 60.0) -> None:
    """Ray's list says these ended by themselves (their actors live on: the fake lists them)."""
    now_ms = time.time() * 1000
    for job in bed.upstream.jobs:
        if job["job_id"] in jobs:
            job.update(status="SUCCEEDED", start_time=now_ms - started_s_ago * 1000,
                       end_time=now_ms - (started_s_ago - 2) * 1000)


def _reapers(bed: Bed) -> list[list[str]]:
    """The Ray job ids each reaper job the gateway submitted was told to reap."""
    found = []
    for method, path, body in bed.upstream.seen:
        if method == "POST" and path == "/api/jobs/" and b"rayfleet_reaper" in body:
            argv = json.loads(body)["entrypoint"]
            found.append(sorted(j for j in ("01000000", "02000000", "03000000") if j in argv))
    return found


def _tick(bed: Bed) -> None:
    assert bed.on_gateway(bed.gateway.account()) == 200


def test_leftovers_go_once_their_job_started_max_job_hours_ago(beds: Any) -> None:
    with beds(max_job_hours=0.01) as bed:  # 36 s
        _end(bed, "01000000", "02000000", started_s_ago=10)
        _tick(bed)  # both ended within their hours: their actors may stay, charged
        assert _reapers(bed) == []
        _tick(bed)
        assert bed.gateway.usage.jobs["raysubmit_ann1"].leftover_until > \
            bed.gateway.usage.jobs["raysubmit_ann1"].end_time
        _end(bed, "01000000", started_s_ago=40)  # ann's started 40 s ago: past 36 s
        _tick(bed)
        assert _reapers(bed) == [["01000000"]]
        _tick(bed)  # still listed alive a moment later: not a second reaper at once
        assert _reapers(bed) == [["01000000"]]
        entry = bed.gateway.usage.jobs["raysubmit_ann1"]
        assert "max_job_hours" in entry.leftovers_reason


def test_a_removed_members_leftovers_go(beds: Any) -> None:
    with beds() as bed:
        _end(bed, "01000000", "02000000")
        _tick(bed)
        assert _reapers(bed) == []
        members = Path(bed.gateway.config.data_dir) / gs.MEMBERS_FILE
        data = json.loads(members.read_text())
        del data["members"]["bo"]
        members.write_text(json.dumps(data))
        _tick(bed)
        assert _reapers(bed) == [["02000000"]]


def test_past_the_clusters_budget_every_finished_jobs_leftovers_go(beds: Any) -> None:
    """Whoever's: a member's, and a driver's started inside the cluster (no submission); a job
    still running is stopped as a job, not reaped."""
    with beds(budget_usd=1.0, price_per_hour=3.6e9) as bed:  # $1 a millisecond
        _end(bed, "01000000", "03000000")
        _tick(bed)
        assert bed.gateway.usage.cluster.budget_reached_at
        assert _reapers(bed) == [["01000000", "03000000"]]


def test_an_ended_job_whose_actors_live_on_holds_a_slot_of_the_running_jobs_cap(
        beds: Any) -> None:
    """A job that ends by itself and leaves a detached actor must not free its slot: else a
    member holds the cluster with any number of them, each under the cap at its submit."""
    with beds(max_running_jobs_per_member=1) as bed:
        _end(bed, "01000000")
        _tick(bed)
        _tick(bed)  # the tick after its end sees its actor alive
        assert bed.gateway.usage.jobs["raysubmit_ann1"].leftover_until
        body = json.dumps({"entrypoint": "true"}).encode()
        status, text = bed.send("POST", "/api/jobs/", body=body)
        assert status == 429, text
        assert b"1 ended, their actors still alive" in text
        assert b"sharing.max_running_jobs_per_member" in text

"""A member's own view (issue 49, defect 14): `GET /rayfleet/usage` answers their hours, cost and
budget left from the gateway's own record, the dashboard banner shows the same figures, and a
member at 80 % of their budget is told at their next submit in the job's status message (stock
`ray job submit` prints only the job's id; `ray job status` and the dashboard show the message).
The real gateway over TLS (gateway_bed)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.gateway_bed import BO, OWNER, Bed, gateway_bed


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed(tmp_path, monkeypatch, member_budget_hours=2.0,
                     member_budget_usd=10.0, members_see_dashboard=True) as started:
        yield started


def _ran(bed: Bed, job: str, hours: float, cost: float) -> None:
    end = time.time() * 1000
    bed.gateway.usage.note(job, start_time=end - hours * 3.6e6, end_time=end, cost=cost,
                           status="SUCCEEDED")


def _usage(bed: Bed, token: str | None = None) -> dict:
    status, body = bed.send("GET", "/rayfleet/usage", **({"token": token} if token else {}))
    assert status == 200, body
    return json.loads(body)


def test_term_record_a_member_reads_their_own_usage_and_budget_left(bed: Bed) -> None:
    _ran(bed, "raysubmit_ann1", 0.5, 1.25)
    _ran(bed, "raysubmit_bo1", 1.0, 3.0)
    ann = _usage(bed)
    assert (ann["member"], ann["job_hours"], ann["cost_usd"]) == ("ann", 0.5, 1.25)
    assert ann["budget"] == {"job_hours": 2.0, "usd": 10.0}
    assert ann["left"] == {"job_hours": 1.5, "usd": 8.75}
    assert ann["used"] == 0.25 and ann["note"] is None and ann["total_jobs"] == 1
    assert _usage(bed, BO)["job_hours"] == 1.0  # each their own
    assert _usage(bed, OWNER)["budget"] == {"job_hours": None, "usd": None}
    assert bed.send("POST", "/rayfleet/usage")[0] == 405


def test_term_record_the_dashboard_banner_shows_the_same_figures(bed: Bed) -> None:
    _ran(bed, "raysubmit_ann1", 0.5, 1.25)
    status, page = bed.send("GET", "/")
    assert status == 200
    assert b"Your usage: 0.50 job-hours, $1.25; budget left: 1.50 job-hours, $8.75 (25% used)" \
        in page


def test_term_record_a_member_near_their_budget_is_told_at_the_next_submit(bed: Bed) -> None:
    _ran(bed, "raysubmit_ann1", 1.7, 1.0)  # 85 % of 2 job-hours
    said = _usage(bed)["note"]
    assert said and said.startswith("member ann has used 85% of their budget (1.70 of 2 job-hours")
    body = json.dumps({"entrypoint": "true", "submission_id": "raysubmit_ann2"}).encode()
    assert bed.send("POST", "/api/jobs/", body=body)[0] == 200
    bed.upstream.jobs.append({"submission_id": "raysubmit_ann2", "job_id": "04000000",
                              "status": "RUNNING", "message": "Job is currently running."})
    status, answer = bed.send("GET", "/api/jobs/raysubmit_ann2")
    assert status == 200
    assert json.loads(answer)["message"] == f"Job is currently running. ({said})"
    # bo, far from theirs, is told nothing.
    assert _usage(bed, BO)["note"] is None

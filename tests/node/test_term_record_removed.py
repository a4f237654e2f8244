"""A removed member, as the gateway sees them: their refusal names them and the day (defect 12),
`member-remove --stop-jobs` records why their jobs stopped with an audit line (defect 7), and a
name removed and added again keeps one budget for the term. The registry is written by the owner's
own `term.remove`, as `member-remove` writes it, to the real gateway over TLS (gateway_bed)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.core.sharing import term as sharing_term
from infra.node import gateway_removals
from infra.node import gateway_state as gs
from tests.node.gateway_bed import BO, Bed, gateway_bed

REMOVED_AT = "2026-11-28T00:00:00+00:00"  # the end of 2026-11-27, as a date is stored


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed(tmp_path, monkeypatch, member_budget_hours=0.5) as started:
        yield started


def _members_file(bed: Bed) -> Path:
    return Path(bed.gateway.config.data_dir) / gs.MEMBERS_FILE


def _remove_bo(bed: Bed, stop_jobs: bool, when: str = REMOVED_AT) -> dict[str, Any]:
    """As `member-remove bo [--stop-jobs]` writes the registry the gateway reads."""
    path = _members_file(bed)
    book = json.loads(path.read_text())
    sharing_term.remove(book, "bo", when=when, stop_jobs=stop_jobs)
    path.write_text(json.dumps(book))
    return book


def _audit(bed: Bed) -> list[dict[str, Any]]:
    text = (Path(bed.gateway.config.data_dir) / gs.AUDIT_FILE).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_term_record_a_removed_members_refusal_names_them_and_the_day(bed: Bed) -> None:
    book = _remove_bo(bed, stop_jobs=False)
    assert "token_sha256" not in json.dumps(book["removed"])  # never a way in
    status, body = bed.send("GET", "/api/jobs/", token=BO)
    assert status == 403
    assert body.decode().strip() == ("member bo was removed from this cluster on 2026-11-27 "
                                     "23:59 UTC; ask the cluster's owner")
    # A token nobody ever held still reads as before.
    status, body = bed.send("GET", "/api/jobs/", token="t-nobody")
    assert status == 403 and b"unknown or revoked token" in body


def test_term_record_an_expiry_reads_as_the_last_minute_of_its_day(bed: Bed) -> None:
    path = _members_file(bed)
    book = json.loads(path.read_text())
    book["members"]["bo"]["expires"] = REMOVED_AT
    path.write_text(json.dumps(book))
    status, body = bed.send("GET", "/api/jobs/", token=BO)
    assert status == 403 and "expired on 2026-11-27 23:59 UTC;" in body.decode()


def test_term_record_stop_jobs_stops_and_records_the_reason(bed: Bed) -> None:
    """bo's job still runs after the owner's command (its own stop failed, or has not landed):
    the gateway's tick stops it with the reason; ann's job is left alone."""
    _remove_bo(bed, stop_jobs=True, when=gs.now_iso())
    bed.on_gateway(bed.gateway.account())
    assert ("POST", "/stop", "raysubmit_bo1") in bed.upstream.acted
    assert not [a for a in bed.upstream.acted if a[2] == "raysubmit_ann1"]
    record = bed.gateway.usage.jobs["raysubmit_bo1"]
    assert record.stopped_reason == gateway_removals.REASON
    assert any(line.get("reason") == gateway_removals.REASON and line.get("job") ==
               "raysubmit_bo1" for line in _audit(bed))


def test_term_record_a_job_the_owner_stopped_straight_through_ray_gets_the_reason(bed: Bed) -> None:
    _remove_bo(bed, stop_jobs=True, when=gs.now_iso())
    bo_job = next(j for j in bed.upstream.jobs if j["submission_id"] == "raysubmit_bo1")
    bo_job.update(status="STOPPED", end_time=time.time() * 1000 + 1000)
    bed.on_gateway(bed.gateway.account())
    assert not bed.upstream.acted  # nothing left to stop
    assert bed.gateway.usage.jobs["raysubmit_bo1"].stopped_reason == \
        gateway_removals.REASON
    assert [line for line in _audit(bed) if line.get("reason") == gateway_removals.REASON]


def test_term_record_removal_without_stop_jobs_leaves_their_jobs(bed: Bed) -> None:
    _remove_bo(bed, stop_jobs=False, when=gs.now_iso())
    bed.on_gateway(bed.gateway.account())
    assert not bed.upstream.acted
    assert not bed.gateway.usage.jobs["raysubmit_bo1"].stopped_reason


def test_term_record_a_budget_carries_over_a_removal_and_re_add(bed: Bed) -> None:
    """bo used an hour under their first entry; added again (a new id and token) with a budget
    of 0.5 job-hours per person, their submit is refused."""
    hour_ago = time.time() * 1000 - 3.6e6
    bed.gateway.usage.note("raysubmit_bo1", start_time=hour_ago, end_time=hour_ago + 3.6e6,
                           status="SUCCEEDED")
    book = _remove_bo(bed, stop_jobs=False)
    book["members"]["bo"] = {"role": "member", "id": "b3b3b3b3b3b3b3b3",
                             "token_sha256": gs.token_hash("t-bo-again")}
    _members_file(bed).write_text(json.dumps(book))
    body = json.dumps({"entrypoint": "true", "submission_id": "raysubmit_bo2"}).encode()
    status, text = bed.send("POST", "/api/jobs/", token="t-bo-again", body=body)
    assert status == 429, text
    assert text.decode().startswith("member bo has used 1.00 job-hours of their budget")
    # ann, who used nothing, is not refused.
    body = json.dumps({"entrypoint": "true", "submission_id": "raysubmit_ann2"}).encode()
    assert bed.send("POST", "/api/jobs/", body=body)[0] == 200

"""An id means one thing: a member's job id is never one Ray reads as another job's.

Ray's job API reads an id first as a Ray job id (8 hex digits: a driver's, then a submission whose
driver holds it) and only then as a submission id; the bed's upstream resolves ids in that order
(gateway_bed.find_job_by_ids). bo's job `raysubmit_bo1` has the driver of Ray job id 02000000, a
driver started inside the cluster holds 03000000. Requests are written byte for byte over TLS to
the real gateway."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.gateway_bed import IDS, OWNER, Bed, gateway_bed

#: Every route by which a member reaches one job: method and the path after its id.
ROUTES = (("GET", ""), ("GET", "/logs"), ("GET", "/logs/tail"), ("POST", "/stop"), ("DELETE", ""))


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed(tmp_path, monkeypatch) as started:
        yield started


def _submit(bed: Bed, submission_id: str) -> tuple[int, bytes]:
    body = json.dumps({"entrypoint": "true", "submission_id": submission_id}).encode()
    return bed.send("POST", "/api/jobs/", body=body)


def test_a_member_cannot_name_their_job_with_an_id_ray_reads_as_a_ray_job_id(bed: Bed) -> None:
    """The attack: ann submits a no-op named 02000000, then asks for "her" job by that id."""
    for claimed in ("02000000", "0A000000", "deadBEEF", "ffffffff"):
        status, text = _submit(bed, claimed)
        assert status == 400, (claimed, status, text)
        line = text.decode().strip()
        assert "\n" not in line and line.startswith(f"submission_id '{claimed}'") \
            and "Ray job id" in line and "leave it out" in line, line
    assert not [p for m, p, _ in bed.upstream.seen if m == "POST"]
    # Nine characters, or a letter past f: not Ray's, so the member's to use.
    for fine in ("020000000", "0200000g"):
        assert _submit(bed, fine)[0] == 200, fine
    for method, action in ROUTES:
        status, text = bed.send(method, f"/api/jobs/02000000{action}")
        assert (status, text.strip()) == (404, b"Job 02000000 does not exist"), (method, action)
        assert b"raysubmit_bo1" not in text
    assert bed.upstream.acted == []


def test_an_answer_about_another_job_is_refused_even_for_an_id_the_member_holds(bed: Bed) -> None:
    """The second line: a record made before ids were checked (or any id Ray reads otherwise)
    still reaches nothing but the job whose submission id it is."""
    for held in ("02000000", "03000000"):
        bed.gateway.usage.note(held, member="ann", member_id=IDS["ann"])
    seen_before = len(bed.upstream.seen)
    for held in ("02000000", "03000000"):
        for method, action in ROUTES:
            status, text = bed.send(method, f"/api/jobs/{held}{action}")
            assert (status, text.strip()) == (404, f"Job {held} does not exist".encode()), \
                (held, method, action, text)
    # Ray was asked which job each id is, and nothing else: nothing of bo's was read or acted on.
    asked = {(m, p) for m, p, _ in bed.upstream.seen[seen_before:]}
    assert asked == {("GET", "/api/jobs/02000000"), ("GET", "/api/jobs/03000000")}, asked
    assert bed.upstream.acted == []
    # Her list holds her own submission, not the inside driver her record's id names.
    status, text = bed.send("GET", "/api/jobs/")
    assert status == 200 and [j["submission_id"] for j in json.loads(text)] == ["raysubmit_ann1"]
    # Her own job: checked, then acted on by the id Ray answered for.
    for method, action in ROUTES:
        if action != "/logs/tail":
            assert bed.send(method, f"/api/jobs/raysubmit_ann1{action}")[0] == 200, action
    assert bed.upstream.acted == [("GET", "/logs", "raysubmit_ann1"),
                                  ("POST", "/stop", "raysubmit_ann1"),
                                  ("DELETE", "", "raysubmit_ann1")]


def test_the_owners_stop_by_ray_job_id_stops_and_follows_the_job_ray_resolved(bed: Bed) -> None:
    """The owner's requests go to Ray as they are, with Ray's reading of ids; their stop is the
    gateway's, recorded and followed under the submission Ray stopped, not under the id asked."""
    status, text = bed.send("GET", "/api/jobs/02000000", token=OWNER)
    assert status == 200 and json.loads(text)["submission_id"] == "raysubmit_bo1"
    status, _ = bed.send("POST", "/api/jobs/02000000/stop", token=OWNER)
    assert status == 200
    stops = [p for m, p, _ in bed.upstream.seen if m == "POST" and p.endswith("/stop")]
    assert stops == ["/api/jobs/raysubmit_bo1/stop"]
    jobs = bed.gateway.usage.jobs
    assert "02000000" not in jobs and jobs["raysubmit_bo1"].stop_requested
    # An id Ray knows nothing of is answered as Ray answers it; nothing is stopped.
    status, text = bed.send("POST", "/api/jobs/0f000000/stop", token=OWNER)
    assert (status, text.strip()) == (404, b"Job 0f000000 does not exist")
    assert bed.upstream.acted == [("POST", "/stop", "raysubmit_bo1")]


def test_a_job_read_before_any_tick_keeps_its_ray_job_id_for_its_leftovers(bed: Bed) -> None:
    """A member who deletes their job before the gateway's first tick listed it: once Ray has
    forgotten the submission, only the Ray job id the gateway kept finds what the job left."""
    bed.gateway.usage.note("raysubmit_ann1", member="ann", member_id=IDS["ann"])
    assert "ray_job_id" not in bed.gateway.usage.jobs["raysubmit_ann1"].to_dict()
    status, _ = bed.send("DELETE", "/api/jobs/raysubmit_ann1")
    assert status == 200
    assert bed.gateway.usage.jobs["raysubmit_ann1"].ray_job_id == "01000000"

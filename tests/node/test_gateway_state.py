"""The gateway's bookkeeping on the head (infra/node/gateway_state.py), on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from infra.node import gateway_state as gs


def test_failed_logins_turn_a_source_away_after_the_limit() -> None:
    failures = gs.FailedLogins()
    for _ in range(gs.MAX_FAILURES - 1):
        failures.failed("192.0.2.7")
    assert failures.blocked("192.0.2.7") == 0
    failures.failed("192.0.2.7")
    assert 0 < failures.blocked("192.0.2.7") <= gs.WINDOW
    assert failures.blocked("192.0.2.8") == 0  # per source address


def test_members_file_is_reread_when_it_changes_and_holds_only_hashes(tmp_path: Path) -> None:
    path = tmp_path / gs.MEMBERS_FILE
    path.write_text(json.dumps({"members": {"ann": {"role": "member",
                                                    "token_sha256": gs.token_hash("t1")}}}))
    members = gs.Members(path)
    found = members.lookup("t1")
    assert found is not None and found.name == "ann" and members.lookup("t2") is None
    path.write_text(json.dumps({"members": {}}))
    os.utime(path, ns=(1, 1))  # a different stamp even within the file system's time resolution
    assert members.lookup("t1") is None
    assert "t1" not in path.read_text()


def test_usage_survives_a_restart_and_splits_the_price(tmp_path: Path) -> None:
    path = tmp_path / gs.USAGE_FILE
    usage = gs.Usage(path)
    _submitted(usage, a="ann", b="bo")
    jobs: list[dict[str, Any]] = [
            {"submission_id": "a", "status": "RUNNING", "metadata": {"rayfleet_member": "ann"},
             "start_time": 0, "end_time": None},
            {"submission_id": "b", "status": "RUNNING", "metadata": {"rayfleet_member": "bo"},
             "start_time": 0, "end_time": 3_600_000},
            {"submission_id": "c", "status": "RUNNING", "metadata": {}}]
    usage.tick(jobs, 3600, 3.0)
    usage.save()
    again = gs.Usage(path)
    # Split among every job running, the owner's (c) included: each pays a third.
    assert again.jobs["a"].cost == 1.0 and again.jobs["b"].cost == 1.0
    assert again.cluster.owner_usd == 1.0
    assert "c" not in again.jobs
    assert gs.job_hours(again.jobs["b"]) == 1.0
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def _submitted(usage: gs.Usage, **members: str) -> None:
    """What the gateway records at each member's submit (who is who comes only from here)."""
    for key, member in members.items():
        usage.note(key, member=member, member_id=f"id-{member}", submitted=gs.now_iso())


def _job(key: str, status: str, member: str | None) -> dict[str, Any]:
    return {"submission_id": key, "status": status,
            "metadata": {"rayfleet_member": member} if member else {}}


def test_cost_shares_of_overlapping_jobs_sum_to_the_accrued_cost(tmp_path: Path) -> None:
    path = tmp_path / gs.USAGE_FILE
    usage = gs.Usage(path)
    _submitted(usage, a="ann", b="bo")
    usage.tick([_job("a", "RUNNING", "ann")], 1800, 2.0)  # ann alone: $1
    usage.tick([_job("a", "RUNNING", "ann"), _job("b", "RUNNING", "bo")], 3600, 2.0)  # $2 in two
    usage.save()
    usage = gs.Usage(path)  # a gateway restart in the middle: what is on disk goes on
    # The cluster grew (a worker joined): $6/h from here, split three ways with the owner's job.
    usage.tick([_job("a", "RUNNING", "ann"), _job("b", "RUNNING", "bo"), _job("o", "RUNNING", None)],
               1200, 6.0)
    usage.tick([_job("a", "SUCCEEDED", "ann"), _job("b", "STOPPED", "bo"), _job("o", "FAILED", None)],
               600, 6.0)  # nothing runs: idle
    usage.save()
    again = gs.Usage(path)
    ann, bo = again.jobs["a"].cost, again.jobs["b"].cost
    cluster = again.cluster
    assert ann == pytest.approx(1 + 1 + 2 / 3) and bo == pytest.approx(1 + 2 / 3)
    assert cluster.owner_usd == pytest.approx(2 / 3) and cluster.idle_usd == pytest.approx(1.0)
    assert cluster.accrued_usd == pytest.approx(1 + 2 + 2 + 1)
    assert ann + bo + cluster.owner_usd + cluster.idle_usd == pytest.approx(
        cluster.accrued_usd)
    assert cluster.hourly_usd == 6.0


def test_a_job_that_starts_and_ends_between_two_ticks_pays_for_its_time(tmp_path: Path) -> None:
    """Ray's own start and end times place a job inside the tick: a 10-minute job that ran and
    finished between two ticks an hour apart pays its 10 minutes, alone for the first 5 and
    sharing the next 5 with the owner's job still running; the rest of the hour is the owner's
    and idle. A pending job, and one that ended before the tick's window, pay nothing."""
    usage = gs.Usage(tmp_path / gs.USAGE_FILE)
    _submitted(usage, a="ann", p="bo", old="bo")
    now = 1_800_000_000.0
    ms = 1000

    def at(minutes: float) -> float:  # Ray's milliseconds, `minutes` into the window
        return (now - 3600 + minutes * 60) * ms

    jobs = [{**_job("a", "SUCCEEDED", "ann"), "start_time": at(20), "end_time": at(30)},
            {**_job("o", "RUNNING", None), "start_time": at(25), "end_time": None},
            {**_job("p", "PENDING", "bo"), "start_time": at(50), "end_time": None},
            {**_job("old", "STOPPED", "bo"), "start_time": at(-30), "end_time": at(-10)}]
    usage.tick(jobs, 3600, 6.0, now=now)  # $0.10 a minute
    cluster = usage.cluster
    assert usage.jobs["a"].cost == pytest.approx(0.5 + 0.25)
    assert cluster.owner_usd == pytest.approx(0.25 + 3.0)  # 5 min shared, then 30 alone
    assert cluster.idle_usd == pytest.approx(2.0)  # the first 20 minutes
    assert usage.jobs["p"].cost == usage.jobs["old"].cost == 0.0
    assert usage.jobs["a"].cost + cluster.owner_usd + cluster.idle_usd == \
        pytest.approx(cluster.accrued_usd) == pytest.approx(6.0)


def test_maybe_active_counts_a_members_jobs_until_ray_reports_them_finished(tmp_path: Path) -> None:
    usage = gs.Usage(tmp_path / gs.USAGE_FILE)
    _submitted(usage, a="ann", b="ann", c="ann", d="bo")  # a: not yet seen by a tick
    usage.tick([{"submission_id": "b", "status": "RUNNING", "metadata": {"rayfleet_member": "ann"}},
                {"submission_id": "c", "status": "SUCCEEDED", "metadata": {"rayfleet_member": "ann"}},
                {"submission_id": "d", "status": "PENDING", "metadata": {"rayfleet_member": "bo"}}],
               5, 0.0)
    assert usage.maybe_active("id-ann") == 2 and usage.maybe_active("id-bo") == 1
    # Ray's list is always whole: a job it no longer lists was deleted (gateway_usage.gone_records).
    usage.tick([{"submission_id": "a", "status": "STOPPED", "metadata": {"rayfleet_member": "ann"}},
                {"submission_id": "b", "status": "RUNNING", "metadata": {"rayfleet_member": "ann"}}],
               5, 0.0)
    assert usage.maybe_active("id-ann") == 1 and usage.maybe_active("id-cy") == 0


def test_metadata_a_job_sets_itself_attributes_it_to_nobody(tmp_path: Path) -> None:
    """Code inside the cluster can start a driver with any metadata: only a submit through the
    gateway makes a job a member's (counted against their cap, shown to them, charged to them)."""
    usage = gs.Usage(tmp_path / gs.USAGE_FILE)
    _submitted(usage, a="ann")
    forged = {"submission_id": None, "job_id": "03000000", "status": "RUNNING",
              "metadata": {"rayfleet_member": "ann"}}
    usage.tick([_job("a", "RUNNING", "ann"), forged], 3600, 2.0)
    assert usage.member_id_of("03000000") is None and usage.member_id_of("a") == "id-ann"
    assert usage.maybe_active("id-ann") == 1
    assert usage.jobs["a"].cost == 1.0 and usage.cluster.owner_usd == 1.0
    assert usage.file.unattributed["03000000"]["status"] == "RUNNING"
    # A member re-added under the same name is another member: the old one's records stay theirs.
    assert usage.member_id_of("a") != gs.legacy_id("ann")


def test_failed_logins_forget_quiet_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(gs.time, "monotonic", lambda: now[0])
    failures = gs.FailedLogins()
    for i in range(500):  # a scan from many addresses
        failures.failed(f"192.0.2.{i % 250}")
    assert failures.blocked("198.51.100.1") == 0 and len(failures) == 250
    now[0] += gs.WINDOW + 1
    failures.prune()
    assert len(failures) == 0


def test_a_member_past_the_request_rate_waits_and_others_do_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [50.0]
    monkeypatch.setattr(gs.time, "monotonic", lambda: now[0])
    rate = gs.RequestRate(rate=10, burst=5)
    assert [rate.take("ann") for _ in range(5)] == [0.0] * 5
    assert rate.take("ann") == pytest.approx(0.1)
    assert rate.take("bo") == 0.0
    now[0] += 0.1
    assert rate.take("ann") == 0.0


def test_the_audit_log_rotates_and_keeps_a_bounded_number_of_files(tmp_path: Path) -> None:
    audit = gs.Audit(tmp_path / gs.AUDIT_FILE, max_bytes=300, keep=3)
    for i in range(100):
        audit.write(who="ann", source="192.0.2.1", status=200, n=i)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.log", "audit.log.1", "audit.log.2", "audit.log.3"]
    last = json.loads((tmp_path / "audit.log.1").read_text().splitlines()[-1])
    assert last["source"] == "192.0.2.1" and last["n"] < 100
    assert all(p.stat().st_size < 600 for p in tmp_path.iterdir())


def test_a_secret_file_is_read_again_when_it_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "ray-token"
    path.write_text("old\n")
    secret = gs.SecretFile(str(path))
    assert secret.read() == "old"
    replacement = tmp_path / "new"
    replacement.write_text("new")
    replacement.replace(path)  # as atomic_write does
    assert secret.read() == "new"
    assert gs.SecretFile(None).read() is None

"""The gateway's bookkeeping on the head (infra/node/gateway_state.py), on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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
    jobs: list[dict[str, Any]] = [
            {"submission_id": "a", "status": "RUNNING", "metadata": {"rayfleet_member": "ann"},
             "start_time": 0, "end_time": None},
            {"submission_id": "b", "status": "RUNNING", "metadata": {"rayfleet_member": "bo"},
             "start_time": 0, "end_time": 3_600_000},
            {"submission_id": "c", "status": "RUNNING", "metadata": {}}]
    usage.tick(jobs, 3600, 2.0)
    usage.save()
    again = gs.Usage(path)
    assert again.data["jobs"]["a"]["cost"] == 1.0 and again.data["jobs"]["b"]["cost"] == 1.0
    assert "c" not in again.data["jobs"]
    assert gs.job_hours(again.data["jobs"]["b"]) == 1.0
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_maybe_active_counts_a_members_jobs_until_ray_reports_them_finished(tmp_path: Path) -> None:
    usage = gs.Usage(tmp_path / gs.USAGE_FILE)
    usage.note("a", member="ann", submitted=gs.now_iso())  # submitted, not yet seen by a tick
    usage.tick([{"submission_id": "b", "status": "RUNNING", "metadata": {"rayfleet_member": "ann"}},
                {"submission_id": "c", "status": "SUCCEEDED", "metadata": {"rayfleet_member": "ann"}},
                {"submission_id": "d", "status": "PENDING", "metadata": {"rayfleet_member": "bo"}}],
               5, 0.0)
    assert usage.maybe_active("ann") == 2 and usage.maybe_active("bo") == 1
    usage.tick([{"submission_id": "a", "status": "STOPPED", "metadata": {"rayfleet_member": "ann"}}],
               5, 0.0)
    assert usage.maybe_active("ann") == 1 and usage.maybe_active("cy") == 0

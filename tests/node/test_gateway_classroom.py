"""A term's limits at the gateway: member and cluster budgets, from the gateway's own usage (which
outlives a restart and a new head), refused in one line naming the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.node import gateway_state as gs
from tests.node.gateway_bed import ANN, BO, IDS, gateway_bed

SUBMIT = json.dumps({"entrypoint": "python -c 1"}).encode()


def _spent(usage: gs.Usage, member: str, hours: float, usd: float) -> None:
    """A finished job of `member` that ran `hours` and cost `usd` (as ticks would record it)."""
    usage.note(f"raysubmit_done_{member}", member=member, member_id=IDS[member],
               status="SUCCEEDED", start_time=0, end_time=hours * 3.6e6, cost=usd)


def test_a_member_past_their_hours_is_refused_naming_the_budget_and_others_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with gateway_bed(tmp_path, monkeypatch, member_budget_hours=2.0) as bed:
        _spent(bed.gateway.usage, "ann", 2.5, 0.0)
        status, text = bed.send("POST", "/api/jobs/", body=SUBMIT)
        assert status == 429 and b"sharing.member_budget_hours 2" in text
        assert bed.send("POST", "/api/jobs/", token=BO, body=SUBMIT)[0] == 200


def test_a_member_past_their_dollars_is_refused(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with gateway_bed(tmp_path, monkeypatch, member_budget_usd=5.0) as bed:
        _spent(bed.gateway.usage, "bo", 0.1, 5.01)
        status, text = bed.send("POST", "/api/jobs/", token=BO, body=SUBMIT)
        assert status == 429 and b"sharing.member_budget_usd $5" in text
        assert bed.send("POST", "/api/jobs/", body=SUBMIT)[0] == 200


def test_a_cluster_past_its_budget_takes_no_new_job(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with gateway_bed(tmp_path, monkeypatch, budget_usd=10.0) as bed:
        assert bed.send("POST", "/api/jobs/", body=SUBMIT)[0] == 200
        bed.gateway.usage.cluster.accrued_usd = 10.0
        for token in (BO, ANN):
            status, text = bed.send("POST", "/api/jobs/", token=token, body=SUBMIT)
            assert status == 429 and b"sharing.budget_usd $10" in text


def test_a_cluster_reaching_its_budget_stops_every_job_once_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 100 % of `budget_usd` the gateway stops every submitted job that runs, records when and
    why, and asks once: the cluster is then idle, for autodown."""
    with gateway_bed(tmp_path, monkeypatch, budget_usd=10.0) as bed:
        bed.gateway.usage.cluster.accrued_usd = 9.99
        assert bed.on_gateway(bed.gateway.account()) == 200
        assert [s for s in bed.upstream.seen if s[1].endswith("/stop")] == []
        assert bed.gateway.usage.cluster.budget_reached_at is None

        bed.gateway.usage.cluster.accrued_usd = 10.0
        assert bed.on_gateway(bed.gateway.account()) == 200
        stops = sorted(s[1] for s in bed.upstream.seen if s[0] == "POST" and s[1].endswith("/stop"))
        # (03000000 is a driver started inside the cluster: Ray's job API cannot stop it.)
        assert stops == ["/api/jobs/raysubmit_ann1/stop", "/api/jobs/raysubmit_bo1/stop"]
        assert bed.gateway.usage.cluster.budget_reached_at
        for job in ("raysubmit_ann1", "raysubmit_bo1"):
            reason = bed.gateway.usage.reason(job)
            assert reason and "spent its budget (sharing.budget_usd $10)" in reason, reason
        # Saved: a restarted gateway knows the budget was reached.
        saved = json.loads((Path(bed.gateway.config.data_dir) / gs.USAGE_FILE).read_text())
        assert saved["cluster"]["budget_reached_at"] == bed.gateway.usage.cluster.budget_reached_at
        audit = (Path(bed.gateway.config.data_dir) / gs.AUDIT_FILE).read_text()
        assert '"method": "BUDGET"' in audit and "sharing.budget_usd $10" in audit

        # The next tick asks no job again (each stop is followed, not repeated).
        before = len(bed.upstream.seen)
        assert bed.on_gateway(bed.gateway.account()) == 200
        assert [s for s in bed.upstream.seen[before:] if s[1].endswith("/stop")] == []

"""`members`, `status` and `report` show each member's own cluster (`isolation: cluster`, issue
48): running or stopped, since when, why, and its node time and cost as the member's hours, cost
and budget used, from the gateway's member-clusters usage file read beside its usage file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.cli import loading
from infra.core.metrics import report
from infra.core.sharing import owner, term_people
from infra.core.sharing import term as sharing_term
from infra.node import member_usage

ALICE, BOB = "0123456789abcdef", "fedcba9876543210"


def spec(**sharing: Any) -> Any:
    return loading.parse_spec(Path("clusters/iso.yaml"), {
        "provider": "local", "sharing": {"isolation": "cluster", **sharing}})


def write_files(clusters: dict[str, Any]) -> None:
    sharing_term.write_book("iso", {"members": {
        "alice": {"role": "member", "id": ALICE, "added": "2026-11-01T00:00:00+00:00"},
        "bob": {"role": "member", "id": BOB, "added": "2026-11-01T00:00:00+00:00"}}})
    folder = owner.folder("iso")
    (folder / "usage.json").write_text(json.dumps({"jobs": {}, "members": {}}))
    (folder / member_usage.USAGE_FILE).write_text(json.dumps(clusters))


def test_members_rows_carry_each_member_cluster_and_its_usage() -> None:
    write_files({ALICE: {"state": "running", "since": "2026-11-28T10:00:00Z", "hours": 2.0,
                         "usd": 1.5, "uploaded": 0, "reason": None},
                 BOB: {"state": "stopped", "since": "2026-11-28T11:00:00Z", "hours": 4.0,
                       "usd": 3.0, "uploaded": 0,
                       "reason": "your cluster has run 4.00 h, your budget ..."}})
    selected = spec(member_budget_hours=4)
    usage = owner.read_usage(selected, None)
    assert set(usage["member_clusters"]) == {ALICE, BOB}
    rows = sharing_term.rows_of(sharing_term.read_book("iso"), usage, {}, selected.sharing)
    persons = {p["name"]: p for p in term_people.people(rows, selected.sharing)}
    assert persons["alice"]["job_hours"] == 2.0 and persons["alice"]["cost_share_usd"] == 1.5
    assert persons["alice"]["budget_used"] == 0.5  # 2 of 4 h: what the gateway counts too
    assert persons["bob"]["budget_used"] == 1.0
    assert persons["alice"]["cluster"]["state"] == "running"
    text = "\n".join(term_people.table_lines(list(persons.values()), selected.sharing))
    assert "own cluster running since 2026-11-28 10:00 UTC" in text
    assert "own cluster stopped since 2026-11-28 11:00 UTC (your cluster has run" in text
    # The report's members' table: its history cell names the cluster.
    page = report.build({"cluster": "iso", "since": 0.0, "until": 3600.0, "step": 60.0,
                         "series": {}, "jobs": [], "members": list(persons.values()),
                         "budget_of": "4 h"}, "here")
    assert "own cluster running since 2026-11-28 10:00 UTC" in page


def test_a_shared_cluster_reads_no_member_clusters_file() -> None:
    write_files({ALICE: {"state": "running", "since": "2026-11-28T10:00:00Z", "hours": 2.0,
                         "usd": 0.0}})
    shared = loading.parse_spec(Path("clusters/iso.yaml"), {
        "provider": "local", "sharing": {"members_run_as_owner": True}})
    usage = owner.read_usage(shared, None)
    assert "member_clusters" not in usage
    rows = sharing_term.rows_of(sharing_term.read_book("iso"), usage, {}, shared.sharing)
    assert all("cluster" not in r and r["job_hours"] == 0 for r in rows)

"""The report of a shared cluster: an owner lane and a members' table over the cluster's whole life,
from the gateway's record (not the metadata a job can set itself)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from infra.cli import metrics as commands_metrics
from infra.core.metrics import report
from infra.node.gateway_files import JobRecord


class _NoProvider:
    """write_report reads nothing of the provider for a cluster that has no state."""


def _kept(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.core.metrics import prometheus as metrics

    monkeypatch.setattr(metrics, "load_kept", lambda cluster: {
        "cluster": cluster, "since": 1000.0, "until": 5000.0, "step": 10.0, "series": {},
        "jobs": [
            {"job": "raysubmit_ann1", "status": "SUCCEEDED", "start": 1100.0, "end": 1900.0,
             "entrypoint": "python a.py", "member": "ann"},
            # Started inside the cluster, claiming to be ann's: the owner lane, not ann's.
            {"job": "03000000", "status": "SUCCEEDED", "start": 2000.0, "end": 2500.0,
             "entrypoint": "python x.py", "member": "ann"}]})
    monkeypatch.setattr(metrics, "history_path", lambda cluster: tmp / "kept.json")
    (tmp / "kept.json").write_text("{}")


def _report(tmp: Path, bo_jobs: int, bo_hours: float, bo_usd: float) -> Path:
    """The report of the kept history with ann's and bo's rows, as the gateway's usage gives them."""
    members: dict[str, Any] = {
        "rows": [{"name": "ann", "role": "member", "total_jobs": 7, "job_hours": 12.25,
                  "cost_share_usd": 31.5},
                 {"name": "bo", "role": "admin", "total_jobs": bo_jobs, "job_hours": bo_hours,
                  "cost_share_usd": bo_usd}],
        "records": {"raysubmit_ann1": JobRecord.from_dict({"member": "ann"})}}
    return commands_metrics.write_report(_NoProvider(), "class", tmp / "r.html",  # type: ignore[arg-type]
                                         members)


def test_the_report_has_an_owner_lane_and_every_members_hours_and_cost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rf_home: Path) -> None:
    _kept(tmp_path, monkeypatch)
    out = _report(tmp_path, bo_jobs=0, bo_hours=0.0, bo_usd=0.0)
    page = out.read_text()
    table = re.search(r"<table data-table=members>(.*?)</table>", page, re.S)
    assert table is not None
    # Columns: member, role, status, jobs, job-hours, cost share, budget used, history.
    assert re.search(r"<td>ann</td><td>member</td><td>[a-z]*</td><td>7</td><td>12.25 h</td>"
                     r"<td>\$31.50</td>", table.group(1))
    assert re.search(r"<td>bo</td><td>admin</td><td>[a-z]*</td><td>0</td>", table.group(1))
    # The job table and the lanes: the forged job is the owner's lane.
    assert "<td>03000000</td><td>owner</td>" in page
    assert "<td>raysubmit_ann1</td><td>ann</td>" in page


def test_a_cluster_without_sharing_has_no_members_section() -> None:
    data = {"cluster": "c", "since": 0.0, "until": 10.0, "step": 10.0, "series": {}, "jobs": []}
    assert "Members" not in report.build(data, "here")


def test_the_members_table_shows_in_a_real_browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    rf_home: Path) -> None:
    from tests.browser_metrics import docs_screenshot, open_page

    _kept(tmp_path, monkeypatch)
    out = _report(tmp_path, bo_jobs=2, bo_hours=0.5, bo_usd=1.25)
    visit = open_page(out, 1000, 1400)
    assert visit.console_errors == [] and visit.requests == [out.resolve().as_uri()]
    assert visit.screenshot.startswith(b"\x89PNG")
    docs_screenshot("report-members.png", visit.screenshot)


def _ann_report(tmp_path: Path, status: str, cost: float) -> str:
    """The report of cluster `class` from the gateway's record alone (member ann, one job of
    `status`), checked for ann's row and job; the page."""
    members: dict[str, Any] = {
        "rows": [{"name": "ann", "role": "member", "total_jobs": 1, "job_hours": 0.5,
                  "cost_share_usd": cost}],
        "records": {"raysubmit_ann1": JobRecord.from_dict({
            "member": "ann", "status": status, "start_time": 1.7e12, "end_time": 1.7e12 + 1.8e6,
            "entrypoint": "python a.py"})}}
    out = commands_metrics.write_report(_NoProvider(), "class", tmp_path / "r.html",  # type: ignore[arg-type]
                                        members)
    page = out.read_text()
    table = re.search(r"<table data-table=members>(.*?)</table>", page, re.S)
    assert table is not None and re.search(r"<td>ann</td><td>member</td><td>[a-z]*</td><td>1</td>",
                                           table.group(1))
    assert "<td>raysubmit_ann1</td><td>ann</td>" in page
    return page


def test_a_shared_cluster_without_prometheus_still_reports_its_members_and_jobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`metrics: none`: no charts, but the members' table and the jobs from the gateway's record
    (a running cluster with no Prometheus and no kept copy refused the report before)."""
    from tests.classroom_owner import owner_cluster

    owner_cluster(tmp_path, monkeypatch)
    page = _ann_report(tmp_path, "SUCCEEDED", 0.1)
    assert "no charts: the cluster runs no Prometheus" in page
    # No owner lane here (the gateway records only what came through it), and the caption says so.
    assert "owner lane above" not in page and "are not in this report" in page
    # Without sharing there is nothing to show: the one-line refusal stays.
    with pytest.raises(commands_metrics.MetricsError, match="runs no Prometheus"):
        commands_metrics.write_report(_NoProvider(), "class", tmp_path / "r2.html")  # type: ignore[arg-type]


def test_a_shared_cluster_gone_with_no_history_still_reports_its_members_and_jobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After `teardown` of a shared cluster that kept no metrics history (metrics: none), the
    gateway's record (its copy here, which `members` reads) still gives the term's report."""
    from infra.core import state
    from tests.classroom_owner import owner_cluster

    owner_cluster(tmp_path, monkeypatch)
    state.state_path("class").unlink()  # torn down
    page = _ann_report(tmp_path, "STOPPED", 0.0)
    assert "no charts: the cluster is gone and no metrics history of it was kept" in page
    with pytest.raises(commands_metrics.MetricsError, match="has no metrics history"):
        commands_metrics.write_report(_NoProvider(), "class", tmp_path / "r2.html")  # type: ignore[arg-type]

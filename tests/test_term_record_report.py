"""Issue 49: one record for the term (defects 2 and 13), from canned histories: each run kept
by its cluster id, never overwritten; `report` and `report --json` over every run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from infra.cli import metrics as commands_metrics
from infra.core.metrics import report, report_html, report_runs


def _run(start: float, nodes: float, job: str) -> dict[str, Any]:
    """One run's history: `nodes` head nodes (a local head's type is its raw id) for an hour."""
    points = [[start + 60 * i, nodes] for i in range(61)]
    return {"version": 1, "cluster": "class", "since": start, "until": start + 3600.0,
            "step": 60.0, "hourly_usd_per_node": 0.0, "taken_at": "2026-11-27T10:00:00+00:00",
            "series": {"nodes_by_type": [{"labels": {"NodeType": "9f" * 14}, "values": points}]},
            "jobs": [{"job": job, "status": "SUCCEEDED", "start": start + 60, "end": start + 120,
                      "entrypoint": "python a.py"}]}


@pytest.fixture
def two_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    first = report_runs.keep_run("class", "c-first", _run(1_800_000_000.0, 1.0, "raysubmit_a"))
    report_runs.keep_run("class", "c-second", _run(1_800_100_000.0, 1.0, "raysubmit_b"))
    return first


def test_term_record_defect2_a_second_run_never_overwrites_the_first(two_runs: Path) -> None:
    before = two_runs.read_bytes()
    assert (two_runs.parent / "c-second.json.gz").exists() and two_runs.read_bytes() == before
    index = json.loads((two_runs.parent / report_runs.INDEX_FILE).read_text())
    assert [e["cluster_id"] for e in index] == ["c-first", "c-second"]


class _NoProvider:
    pass


def test_term_record_defect2_report_json_holds_every_job_and_node_hour_of_both_runs(
        two_runs: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.cli import common

    monkeypatch.setattr(common, "select", lambda p, c: (type("S", (), {
        "name": "class", "sharing": None})(), _NoProvider()))
    commands_metrics.report_command(None, "class", None, as_json=True)
    found = json.loads(capfd.readouterr().out)
    assert [j["job"] for j in found["jobs"]] == ["raysubmit_a", "raysubmit_b"]
    assert [r["cluster_id"] for r in found["runs"]] == ["c-first", "c-second"]
    # One node for an hour in each run: 2 node-hours, none for the days between the runs.
    assert found["node_hours"] == pytest.approx(2.0)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", found["jobs"][0]["start"])
    commands_metrics.report_command(None, "class", None, as_json=True, since="2027-01-16")
    assert [j["job"] for j in json.loads(capfd.readouterr().out)["jobs"]] == ["raysubmit_b"]


def test_term_record_defect13_no_gone_node_carried_forward_readable_legend_whole_ticks(
        two_runs: Path) -> None:
    data = report_runs.merge("class", report_runs.runs("class"))
    counts = report.node_count(data["series"])
    between = [v for t, v in counts.items() if 1_800_003_600.0 < t < 1_800_100_000.0]
    assert between == [0.0]  # the first run's node ends with the first run
    assert max(counts.values()) == 1.0
    page = report.build(data, "test")
    nodes_chart = page.split('data-chart="nodes"', 1)[1].split("</svg>", 1)[0]
    assert "9f9f9f9f9f9f9f9f" not in nodes_chart and "node 9f9f9f9f" in nodes_chart
    ticks = re.findall(r'text-anchor="end">([^<]*)</text>', nodes_chart)
    assert ticks and all(float(t) == int(float(t)) for t in ticks), ticks


def test_term_record_defect13_tick_steps_are_round() -> None:
    assert report_html.nice_step(1.1, whole=True) == 1.0
    assert report_html.nice_step(1.1) == 0.5
    assert report_html.nice_step(110.0) == 50.0

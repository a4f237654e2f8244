"""Issue 49's "Done means", end to end: a shared local cluster with Prometheus goes up, two
members each run a job, it is torn down, goes up again, runs two more jobs, and is torn down.
`report --json` then holds every job of both runs, each member's job count as `members` gives
it, and node-hours that are the sum of the two runs' own (no node of the first run carried
through the time between them). Members use Ray's stock job CLI through the gateway.

Between the runs, what a class cluster's owner sees after autodown or `teardown` then `up`
overnight: the gateway's port closed at the teardown, the new `up`'s one-line warning
(`members_run_as_owner`) and no new bundles needed, and the same registry and usage after."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from infra.core.metrics import report, report_runs
from infra.node import rayproc
from tests.conftest import ROOT, run_invoke
from tests.local.test_e2e_sharing import Member, Shared, warns_once
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def _up(cluster: Shared) -> subprocess.CompletedProcess[str]:
    done = cluster.invoke("up")
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _run_jobs(members: list[Member]) -> list[str]:
    """One short job per member (Ray's CLI), each waited for until Ray reports it succeeded (read
    over HTTP, as `ray job status` reads it: a CLI a poll is 2-3 s of CPU on 2 cores)."""
    ids = [m.submit(f"python -c print({i})") for i, m in enumerate(members)]
    for member, job in zip(members, ids, strict=True):
        record = member.ended(job, timeout=90)
        assert record["status"] == "SUCCEEDED", (record, member.get(f"/api/jobs/{job}/logs").text)
    return ids


def _torn_down(cluster: Shared) -> str:
    done = cluster.invoke("teardown")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "metrics history kept" in done.stdout + done.stderr, done.stdout + done.stderr
    return done.stdout


def _rows(cluster: Shared, jobs: list[str]) -> dict[str, dict]:
    """`members --json`'s rows by name, once the gateway recorded `jobs` as ended (read from its
    file: an `invoke` a poll is 1-2 s of CPU)."""
    usage = Path(cluster.env["RAYFLEET_HOME"]) / "sharing" / cluster.spec.stem / "usage.json"
    wait_until(lambda: all((json.loads(usage.read_text()) if usage.exists() else {})
                           .get("jobs", {}).get(job, {}).get("status") == "SUCCEEDED"
                           for job in jobs), "the gateway records the jobs", timeout=30)
    return {row["name"]: row for row in _json(cluster, "members")["members"]}


def _json(cluster: Shared, *verb: str) -> dict:
    done: subprocess.CompletedProcess[str] = cluster.invoke(*verb, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_term_record_two_runs_make_one_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = rayproc.free_port()
    spec = tmp_path / f"term-{uuid.uuid4().hex[:6]}.yaml"
    spec.write_text("provider: local\nnum_cpus: 2\nobject_store_memory_mb: 100\n"
                    "metrics: prometheus\nmetrics_history: {scrape_interval_s: 2}\n"
                    f"sharing:\n  port: {port}\n  members_run_as_owner: true\n")
    env = {"RAYFLEET_HOME": str(tmp_path / "owner-home")}
    first = run_invoke("-r", str(ROOT), "up", "--cluster", str(spec), env=env, cwd=tmp_path)
    cluster = Shared(spec, env, port, tmp_path, first.stdout + first.stderr, first.stderr)
    assert first.returncode == 0, cluster.up_output
    try:
        members = cluster.enrol("alice", "bob")
        jobs = _run_jobs(members)
        before = _rows(cluster, jobs)
        _torn_down(cluster)
        assert not rayproc.port_answers("127.0.0.1", port), "teardown left the gateway listening"
        again = _up(cluster)
        warns_once(again.stderr)
        assert "need a new bundle" not in again.stdout + again.stderr, again.stdout + again.stderr
        after = _rows(cluster, jobs)
        assert set(after) == set(before) == {"alice", "bob"}
        for name in ("alice", "bob"):
            assert after[name]["total_jobs"] == before[name]["total_jobs"] == 1, (before, after)
            assert after[name]["job_hours"] >= before[name]["job_hours"], (before, after)
        jobs += _run_jobs(members)  # the same bundles at the same address: members outlive it
    finally:
        _torn_down(cluster)
    found = _json(cluster, "report")
    assert set(jobs) <= {job["job"] for job in found["jobs"]}
    assert {job["member"] for job in found["jobs"] if job["job"] in jobs} == {"alice", "bob"}
    per_member = {m["name"]: m["total_jobs"] for m in _json(cluster, "members")["members"]}
    assert per_member == {"alice": 2, "bob": 2}
    assert {m["name"]: m["total_jobs"] for m in found["members"]} == per_member
    # Node-hours: each run's own, summed; the gap between the runs holds no node.
    monkeypatch.setenv("RAYFLEET_HOME", env["RAYFLEET_HOME"])
    runs = report_runs.runs(spec.stem)
    assert len(runs) == 2 and len(found["runs"]) == 2
    # Each run read alone, as the report reads it (its nodes counted until the run's end).
    each = [report.node_hours(report_runs.merge(spec.stem, [run])) for run in runs]
    assert all(hours > 0 for hours in each), each
    assert found["node_hours"] == pytest.approx(sum(each), rel=0.02, abs=1e-4)
    lived = sum(float(r["until"]) - float(r["since"]) for r in runs) / 3600
    assert found["node_hours"] <= lived * 1.05 + 1e-3, (found["node_hours"], lived)

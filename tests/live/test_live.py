"""One pass over what a user does with a real account, in file order, through `invoke` only:
a fixed cluster (up, submit, dashboard, autodown at a short idle period, teardown after it),
an autoscaling one (up with no worker, a job that needs one: 0 -> 1, idle: 1 -> 0, teardown),
and `invoke sweep` proving nothing of the run is left. The same scenarios run against a real
account or the fakes (conftest.py, backends.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.live.conftest import Cluster, Run
from tests.waiting import wait_until

SPREAD = Path(__file__).resolve().parents[1] / "data" / "spread_job.py"
SLEEPER = Path(__file__).resolve().parents[1] / "data" / "sleeper.py"
#: Words of a provider row of something that no longer runs or is going (instances, VMs, jobs).
ENDED = ("terminat", "cancel", "complet", "fail", "timeout", "gone", "stopping", "deleting")


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def result_of(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, stdout
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


def alive(report: dict[str, Any]) -> int:
    return sum(1 for node in report.get("nodes", []) if node["state"] == "ALIVE")


def running_rows(report: dict[str, Any]) -> list[dict[str, str]]:
    return [row for row in report["provider_resources"]
            if not any(word in json.dumps(row).lower() for word in ENDED)]


def check_dashboard(cluster: Cluster) -> None:
    """`invoke dashboard` prints a URL that answers only with the cluster's token, until Ctrl+C."""
    backend = cluster.run.backend
    tunnel = backend.popen("dashboard", "--cluster", str(cluster.spec))
    try:
        assert tunnel.stdout is not None
        url = tunnel.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url + (tunnel.stderr.read() if tunnel.poll() else "")
        assert backend.http_get(f"{url}/api/jobs/", None)[0] == 401
        token = backend.home / "keys" / cluster.name / "ray-token"
        assert token.stat().st_mode & 0o777 == 0o600
        code, body = backend.http_get(f"{url}/api/jobs/", token)
        assert code == 200 and "SUCCEEDED" in [j["status"] for j in json.loads(body)], body[-2000:]
    finally:
        # Ctrl+C, as a terminal sends it to the whole foreground group.
        os.killpg(tunnel.pid, signal.SIGINT)
        tunnel.wait(timeout=60)


def test_fixed_cluster_up_submit_dashboard_autodown_teardown(live: Run) -> None:
    backend = live.backend
    cluster = live.cluster("f", live.specs["f"])
    with live.timed("fixed: up"):
        ok(cluster.up())
    # A job that runs until stopped keeps the short autodown away while we look around.
    with live.timed("fixed: a job that keeps it busy"):
        busy = ok(cluster.invoke("submit", "--no-wait", str(SLEEPER))).strip().splitlines()[-1]
    assert cluster.cluster_id(), "up drew no cluster id"
    # (GCP's autoscaler adds the min_workers after `up` returns)
    wait_until(lambda: (
        lambda r: r if r["running"] and alive(r) == backend.fixed_nodes else None)(cluster.status()),
        f"{backend.fixed_nodes} nodes alive",
        timeout=600, interval=3)

    with live.timed("fixed: submit"):
        done = cluster.invoke("submit", "examples/cpu_example.py", "--", "8")
    assert result_of(ok(done))["hosts"], done.stdout
    with live.timed("fixed: dashboard"):
        check_dashboard(cluster)
    report = cluster.status()
    assert report["running"] and not (report["autodown"] or {}).get("removed_at"), report["autodown"]
    ok(cluster.invoke("stop-job", busy))

    # Idle now: the cluster removes itself after autodown_minutes, and says so.
    with live.timed(f"fixed: autodown (idle_minutes={backend.autodown_minutes:g})"):
        wait_until(lambda: cluster.status().get("state") == "removed itself",
                 "the cluster to remove itself",
                 timeout=backend.autodown_minutes * 60 + 300, interval=5)
    with live.timed("fixed: teardown"):
        down = cluster.teardown()
    ok(down)
    assert "removed itself" in down.stderr + down.stdout, down.stderr
    assert not cluster.state_file().exists()


def test_autoscaling_cluster_zero_one_zero(live: Run) -> None:
    backend = live.backend
    cluster = live.cluster("a", live.specs["a"])
    with live.timed("autoscaling: up"):
        ok(cluster.up())
    report = cluster.status()
    assert alive(report) == 1 and len(running_rows(report)) == 1, report  # the head, no worker

    # One-CPU bundles on one node more than the head offers: the autoscaler adds the worker.
    with live.timed("autoscaling: 0 -> 1 and the job"):
        done = cluster.invoke("submit", str(SPREAD), "--", *backend.scale_job_args)
    hosts = result_of(ok(done))["hosts"]
    assert len(hosts) == int(backend.scale_job_args[0]), hosts

    # Idle: the worker goes (1 -> 0); the head stays.
    with live.timed(f"autoscaling: 1 -> 0 (idle_timeout_minutes={backend.worker_idle_minutes:g})"):
        wait_until(lambda: (lambda r: alive(r) == 1 and len(running_rows(r)) == 1)(
            cluster.status()),
            "the idle worker to go", timeout=backend.worker_idle_minutes * 60 + 300, interval=3)
    assert cluster.status()["running"]
    with live.timed("autoscaling: teardown"):
        ok(cluster.teardown())
    assert not cluster.state_file().exists()


def test_sweep_finds_nothing_left(live: Run) -> None:
    for cluster in live.clusters:
        assert not cluster.state_file().exists() or pytest.fail(f"{cluster.name} still has state")
    with live.timed("sweep"):
        listed = json.loads(ok(live.backend.invoke("sweep", "--json", timeout=300)))
    assert listed["resources"] == [], listed
    assert live.backend.leftovers(live.ids) == []

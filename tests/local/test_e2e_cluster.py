"""The local provider end to end, on a real Ray head: up, submit, status, plan, teardown.

Assertions are on what Ray and the operating system report (Ray's state and job APIs, /proc),
not on rayfleet's own printing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.node import rayproc
from tests import forked_cli
from tests.conftest import ROOT, run_invoke
from tests.local.cluster_info import cluster_pids, dashboard_client, read_state
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def _spec(tmp_path: Path, extra: str = "") -> Path:
    name = f"t{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"provider: local\nnum_cpus: 2\nobject_store_memory_mb: 100\n{extra}")
    return path


@pytest.fixture
def cluster(real_daemon: None, tmp_path: Path, rf_home: Path) -> Iterator[Path]:
    """A spec for a fresh local cluster; whatever happens, nothing of it outlives the test."""
    path = _spec(tmp_path)
    yield path
    run_invoke("teardown", "--cluster", str(path))
    leftovers = cluster_pids(path.stem)
    rayproc.terminate(leftovers)
    assert not leftovers, f"test left processes behind: {leftovers}"


def test_smoke_up_submit_status_teardown(cluster: Path, rf_home: Path) -> None:
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    up = run_invoke("up", "--cluster", str(cluster))
    assert up.returncode == 0, up.stderr
    info = read_state(rf_home, cluster.stem)["info"]
    url, headers = dashboard_client(rf_home, cluster.stem)
    assert url.startswith("http://127.0.0.1:") and url in up.stdout
    assert info["address"] in up.stdout and "invoke submit" in up.stdout
    temp_dir = read_state(rf_home, cluster.stem)["resources"][0]["id"]

    nodes = StateApiClient(address=url, headers=headers).list(
        StateResource.NODES, options=ListApiOptions(), raise_on_missing_output=False)
    assert [n.state for n in nodes] == ["ALIVE"]
    assert nodes[0].resources_total["CPU"] == 2.0

    submit = forked_cli.run_invoke("submit", "--cluster", str(cluster), "examples/cpu_example.py",
                                   "--", "4")
    assert submit.returncode == 0, submit.stderr
    result = json.loads(submit.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["tasks"] == 4 and result["nodes"] == [nodes[0].node_id[:12]]
    jobs = JobSubmissionClient(url, headers=headers).list_jobs()
    assert [(j.entrypoint, j.status.value) for j in jobs] == [
        ("python examples/cpu_example.py 4", "SUCCEEDED")]

    status = forked_cli.run_invoke("status", "--cluster", str(cluster), "--json")
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)
    assert reported["running"] is True
    assert [n["state"] for n in reported["nodes"]] == ["ALIVE"]
    assert reported["resources"]["CPU"] == 2.0
    assert [j["status"] for j in reported["jobs"]] == ["SUCCEEDED"]

    # Each process with its command line as it was: a failure below names what went away (a CI
    # run lost one pid, the lowest of all, with nothing left to tell which process it had been).
    before = {pid: rayproc.cmdline(pid)[:160] for pid in cluster_pids(cluster.stem)}
    # A changed spec of the running cluster: `plan` names the field, `up` says it needs a new one.
    cluster.write_text(cluster.read_text().replace("num_cpus: 2", "num_cpus: 3"))
    planned = forked_cli.run_invoke("plan", "--cluster", str(cluster))
    assert "num_cpus: 2 -> 3 (needs a new cluster: `invoke teardown`, then `invoke up`)" in \
        planned.stdout, planned.stdout
    again = run_invoke("up", "--cluster", str(cluster))
    assert again.returncode == 0 and "already running" in again.stderr
    assert "num_cpus changed to 3, but the running cluster keeps 2: it needs a new cluster" in \
        again.stderr, again.stderr
    after = set(cluster_pids(cluster.stem))
    gone = {pid: line for pid, line in before.items() if pid not in after}
    assert not gone, f"a second up must not restart the cluster; gone: {gone}"

    port_base = read_state(rf_home, cluster.stem)["resources"][0]["attrs"]["port_base"]
    down = run_invoke("teardown", "--cluster", str(cluster))
    assert down.returncode == 0, down.stderr
    assert cluster_pids(cluster.stem, port_base) == []
    assert not rayproc.port_answers("127.0.0.1", port_base)
    assert not (rf_home / "state" / f"{cluster.stem}.json").exists()
    assert not Path(temp_dir).exists()

    twice = run_invoke("teardown", "--cluster", str(cluster))
    assert twice.returncode == 0 and "nothing to tear down" in twice.stdout


@pytest.fixture
def hand_started_ray(real_daemon: None, tmp_path: Path) -> Iterator[int]:
    """`ray start --head` on Ray's default ports, as a user would type it."""
    if not (rayproc.port_is_free(6379, "0.0.0.0") and rayproc.port_is_free(8265)):
        pytest.skip("Ray's default ports 6379/8265 are taken on this machine")
    temp = f"/tmp/rf-hand-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([str(Path(sys.executable).with_name("ray")), "start", "--head", "--num-cpus=1",
                    "--object-store-memory=80000000", f"--temp-dir={temp}",
                    "--disable-usage-stats"], env=env, check=True, capture_output=True)
    try:
        yield 6379
    finally:
        rayproc.terminate(rayproc.cluster_processes([temp, rayproc.gcs_marker(6379)]))


def test_hand_started_ray_survives_up_and_teardown(cluster: Path, hand_started_ray: int) -> None:
    theirs = rayproc.cluster_processes([rayproc.gcs_marker(hand_started_ray)])
    gcs = [p for p in rayproc.cluster_processes([re.compile(r"gcs_server")])
           if f"--gcs_server_port={hand_started_ray}" in rayproc.cmdline(p)]
    assert gcs, "the hand-started GCS must be running before the test"
    # Idle workers (`ray::IDLE`) come and go at Ray's own will; every other process must live.
    lasting = [p for p in theirs + gcs if not rayproc.cmdline(p).startswith("ray::IDLE")]
    assert run_invoke("up", "--cluster", str(cluster)).returncode == 0
    assert run_invoke("teardown", "--cluster", str(cluster)).returncode == 0
    assert lasting and all(rayproc.alive(p) for p in lasting)
    assert rayproc.port_answers("127.0.0.1", hand_started_ray)


def test_kill_9_during_up_leaves_state_teardown_can_finish(cluster: Path, rf_home: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "up", "--cluster", str(cluster)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_file = rf_home / "state" / f"{cluster.stem}.json"
    wait_until(state_file.exists, "up to write its state", timeout=60, interval=0.02)
    # Let `ray start` get going so there are processes to find, then kill rayfleet mid-step.
    wait_until(lambda: cluster_pids(cluster.stem) or None, "`ray start`'s processes", timeout=60,
               interval=0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    recorded = read_state(rf_home, cluster.stem)
    assert [r["kind"] for r in recorded["resources"]] == ["ray-head"]
    assert "dashboard_url" not in recorded["info"], "up was killed before it finished"

    down = run_invoke("teardown", "--cluster", str(cluster))
    assert down.returncode == 0, down.stderr
    time.sleep(1)  # a `ray start` killed mid-flight must not resurrect anything
    assert cluster_pids(cluster.stem, recorded["resources"][0]["attrs"]["port_base"]) == []
    assert not state_file.exists()


def test_plan_creates_nothing_and_diffs_against_last_up(cluster: Path, rf_home: Path) -> None:
    first = forked_cli.run_invoke("plan", "--cluster", str(cluster), "--json")
    assert first.returncode == 0, first.stderr
    planned = json.loads(first.stdout)
    assert [r["exists"] for r in planned["resources"]] == [False]
    # Before the first `up` there is nothing to diff against: no "changes since" at all.
    assert planned["diff"] == "" and planned["problems"] == []
    text = forked_cli.run_invoke("plan", "--cluster", str(cluster))
    assert "changes since" not in text.stdout and "nothing applied yet" in text.stdout
    assert cluster_pids(cluster.stem) == [] and not (rf_home / "state" / f"{cluster.stem}.json").exists()

    assert run_invoke("up", "--cluster", str(cluster)).returncode == 0
    unchanged = json.loads(forked_cli.run_invoke("plan", "--cluster", str(cluster),
                                                 "--json").stdout)
    assert unchanged["diff"] == "" and [r["exists"] for r in unchanged["resources"]] == [True]

    cluster.write_text(cluster.read_text().replace("num_cpus: 2", "num_cpus: 1"))
    changed = forked_cli.run_invoke("plan", "--cluster", str(cluster))
    assert changed.returncode == 0
    assert "-  --num-cpus=2" in changed.stdout and "+  --num-cpus=1" in changed.stdout
    cluster.write_text(cluster.read_text().replace("num_cpus: 1", "num_cpus: 2"))

    # Then Ray dies while the provider still believes in the cluster (on this test's cluster: an
    # `up` of its own is ~9 CPU-s): one line, the provider view still shown, exit 1.
    rayproc.terminate(cluster_pids(cluster.stem), grace=0.5)
    status = forked_cli.run_invoke("status", "--cluster", str(cluster))
    assert status.returncode == 1
    assert "Traceback" not in status.stderr
    errors = [line for line in status.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Ray is not answering" in errors[0]
    assert "NOT answering" in status.stdout and "ray-head" in status.stdout


def test_commands_on_a_cluster_that_is_not_up(cluster: Path) -> None:
    for args in (["status"], ["dashboard"], ["submit", "examples/cpu_example.py"]):
        result = forked_cli.run_invoke(*args, "--cluster", str(cluster))
        if args == ["status"]:
            assert result.returncode == 0 and "not running" in result.stdout
        else:
            assert result.returncode == 1, args
            assert "start it with `invoke up --cluster=" in result.stderr
            assert "Traceback" not in result.stderr

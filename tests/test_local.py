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

from infra import rayproc
from infra.providers import local
from tests.conftest import ROOT, run_invoke

pytestmark = pytest.mark.slow


def _spec(tmp_path: Path, extra: str = "") -> Path:
    name = f"t{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"provider: local\nnum_cpus: 2\nobject_store_memory_mb: 100\n{extra}")
    return path


def _state(home: Path, name: str) -> dict:
    return json.loads((home / "state" / f"{name}.json").read_text())


def _processes(name: str, port_base: int | None = None) -> list[int]:
    markers: list[str | re.Pattern[str]] = [local.temp_dir(name)]
    if port_base is not None:
        markers.append(rayproc.gcs_marker(port_base))
    return rayproc.cluster_processes(markers)


@pytest.fixture
def cluster(tmp_path: Path, rf_home: Path) -> Iterator[Path]:
    """A spec for a fresh local cluster; whatever happens, nothing of it outlives the test."""
    path = _spec(tmp_path)
    yield path
    run_invoke("teardown", "--cluster", str(path))
    leftovers = _processes(path.stem)
    rayproc.terminate(leftovers)
    assert not leftovers, f"test left processes behind: {leftovers}"


def test_smoke_up_submit_status_teardown(cluster: Path, rf_home: Path) -> None:
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_nodes

    up = run_invoke("up", "--cluster", str(cluster))
    assert up.returncode == 0, up.stderr
    info = _state(rf_home, cluster.stem)["info"]
    url = info["dashboard_url"]
    assert url.startswith("http://127.0.0.1:") and url in up.stdout
    assert info["address"] in up.stdout and "invoke submit" in up.stdout

    nodes = list_nodes(address=url)
    assert [n.state for n in nodes] == ["ALIVE"]
    assert nodes[0].resources_total["CPU"] == 2.0

    submit = run_invoke("submit", "--cluster", str(cluster), "examples/cpu_example.py", "--", "4")
    assert submit.returncode == 0, submit.stderr
    result = json.loads(submit.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["tasks"] == 4 and result["nodes"] == [nodes[0].node_id[:12]]
    jobs = JobSubmissionClient(url).list_jobs()
    assert [(j.entrypoint, j.status.value) for j in jobs] == [
        ("python examples/cpu_example.py 4", "SUCCEEDED")]

    status = run_invoke("status", "--cluster", str(cluster), "--json")
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)
    assert reported["running"] is True
    assert [n["state"] for n in reported["nodes"]] == ["ALIVE"]
    assert reported["resources"]["CPU"] == 2.0
    assert [j["status"] for j in reported["jobs"]] == ["SUCCEEDED"]

    pids = _processes(cluster.stem)
    again = run_invoke("up", "--cluster", str(cluster))
    assert again.returncode == 0 and "already running" in again.stderr
    assert set(pids) <= set(_processes(cluster.stem)), "a second up must not restart the cluster"

    port_base = _state(rf_home, cluster.stem)["resources"][0]["attrs"]["port_base"]
    down = run_invoke("teardown", "--cluster", str(cluster))
    assert down.returncode == 0, down.stderr
    assert _processes(cluster.stem, port_base) == []
    assert not rayproc.port_answers("127.0.0.1", port_base)
    assert not (rf_home / "state" / f"{cluster.stem}.json").exists()
    assert not Path(local.temp_dir(cluster.stem)).exists()

    twice = run_invoke("teardown", "--cluster", str(cluster))
    assert twice.returncode == 0 and "nothing to tear down" in twice.stdout


def test_failed_job_gives_nonzero_exit(cluster: Path, tmp_path: Path) -> None:
    assert run_invoke("up", "--cluster", str(cluster)).returncode == 0
    script = ROOT / "tests" / "data" / "failing_job.py"
    failed = run_invoke("submit", "--cluster", str(cluster), str(script.relative_to(ROOT)))
    assert failed.returncode == 1
    assert "deliberate failure" in failed.stdout + failed.stderr
    assert "FAILED" in failed.stderr


@pytest.fixture
def hand_started_ray(tmp_path: Path) -> Iterator[int]:
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
           if f"--gcs_server_port={hand_started_ray}" in rayproc._cmdline(p)]
    assert gcs, "the hand-started GCS must be running before the test"
    assert run_invoke("up", "--cluster", str(cluster)).returncode == 0
    assert run_invoke("teardown", "--cluster", str(cluster)).returncode == 0
    assert all(rayproc.alive(p) for p in theirs + gcs)
    assert rayproc.port_answers("127.0.0.1", hand_started_ray)


def test_kill_9_during_up_leaves_state_teardown_can_finish(cluster: Path, rf_home: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "up", "--cluster", str(cluster)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_file = rf_home / "state" / f"{cluster.stem}.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not state_file.exists():
        time.sleep(0.02)
    # Let `ray start` get going so there are processes to find, then kill rayfleet mid-step.
    while time.monotonic() < deadline and not _processes(cluster.stem):
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    recorded = _state(rf_home, cluster.stem)
    assert [r["kind"] for r in recorded["resources"]] == ["ray-head"]
    assert recorded["info"] == {}, "up was killed before it finished, so no endpoint is recorded"

    down = run_invoke("teardown", "--cluster", str(cluster))
    assert down.returncode == 0, down.stderr
    time.sleep(1)  # a `ray start` killed mid-flight must not resurrect anything
    assert _processes(cluster.stem, recorded["resources"][0]["attrs"]["port_base"]) == []
    assert not state_file.exists()


def test_plan_creates_nothing_and_diffs_against_last_up(cluster: Path, rf_home: Path) -> None:
    first = run_invoke("plan", "--cluster", str(cluster), "--json")
    assert first.returncode == 0, first.stderr
    planned = json.loads(first.stdout)
    assert [r["exists"] for r in planned["resources"]] == [False]
    assert "+  --num-cpus=2" in planned["diff"]
    assert _processes(cluster.stem) == [] and not (rf_home / "state" / f"{cluster.stem}.json").exists()

    assert run_invoke("up", "--cluster", str(cluster)).returncode == 0
    unchanged = json.loads(run_invoke("plan", "--cluster", str(cluster), "--json").stdout)
    assert unchanged["diff"] == "" and [r["exists"] for r in unchanged["resources"]] == [True]

    cluster.write_text(cluster.read_text().replace("num_cpus: 2", "num_cpus: 1"))
    changed = run_invoke("plan", "--cluster", str(cluster))
    assert changed.returncode == 0
    assert "-  --num-cpus=2" in changed.stdout and "+  --num-cpus=1" in changed.stdout


def test_commands_on_a_cluster_that_is_not_up(cluster: Path) -> None:
    for args in (["status"], ["dashboard"], ["submit", "examples/cpu_example.py"]):
        result = run_invoke(*args, "--cluster", str(cluster))
        if args == ["status"]:
            assert result.returncode == 0 and "not running" in result.stdout
        else:
            assert result.returncode == 1, args
            assert "start it with `invoke up --cluster=" in result.stderr
            assert "Traceback" not in result.stderr


def test_no_wait_logs_stop_job_and_runtime_env(cluster: Path, tmp_path: Path, rf_home: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    assert run_invoke("up", "--cluster", str(cluster)).returncode == 0
    env_file = tmp_path / "runtime.yaml"
    env_file.write_text("env_vars: {GREETING: hello-from-runtime-env}\n")
    submitted = run_invoke("submit", "--cluster", str(cluster), "--runtime-env", str(env_file),
                           "--no-wait", "tests/data/sleeper.py")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().splitlines()[-1]
    assert f"invoke stop-job {job}" in submitted.stderr

    client = JobSubmissionClient(_state(rf_home, cluster.stem)["info"]["dashboard_url"])
    deadline = time.monotonic() + 60
    while "GREETING=" not in client.get_job_logs(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    logs = run_invoke("logs", "--cluster", str(cluster), job)
    assert logs.returncode == 0 and "GREETING=hello-from-runtime-env" in logs.stdout

    stopped = run_invoke("stop-job", "--cluster", str(cluster), job)
    assert stopped.returncode == 0, stopped.stderr
    assert client.get_job_status(job).value == "STOPPED"

    missing = run_invoke("submit", "--cluster", str(cluster), "--runtime-env", "nope.yaml",
                         "tests/data/sleeper.py")
    assert missing.returncode == 2 and "--runtime-env nope.yaml: no such file" in missing.stderr


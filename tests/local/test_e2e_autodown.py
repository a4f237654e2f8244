"""Whole-cluster autodown on the local provider, with real Ray: the cluster's own watcher stops an
idle cluster, and keeps one that runs a job or has a driver connected.

`idle_minutes: 0.1` (6 s) keeps the test short; the watcher then checks every second.
Assertions are on /proc (the cluster's processes) and on what `invoke` reports afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.node import rayproc
from tests import forked_cli
from tests.conftest import run_invoke
from tests.local.temp_dirs import temp_dir_pattern
from tests.waiting import read_json, wait_until, watcher_checked

pytestmark = pytest.mark.slow

IDLE_MINUTES = 0.1


def _processes(temp_dir: str) -> list[int]:
    return rayproc.cluster_processes([temp_dir])


def _state(home: Path, name: str) -> dict:
    return json.loads((home / "state" / f"{name}.json").read_text())


def _wait(predicate, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds until `predicate()` held."""
    started = time.monotonic()
    wait_until(predicate, what, timeout=timeout, interval=0.2)
    return time.monotonic() - started


@pytest.fixture
def spec(real_daemon: None, tmp_path: Path, rf_home: Path) -> Iterator[Path]:
    path = tmp_path / f"ad{uuid.uuid4().hex[:8]}.yaml"
    path.write_text("provider: local\nnum_cpus: 2\nobject_store_memory_mb: 100\n"
                    f"autodown: {{idle_minutes: {IDLE_MINUTES}}}\n")
    yield path
    run_invoke("teardown", "--cluster", str(path))
    leftovers = rayproc.cluster_processes([temp_dir_pattern(path.stem)])
    rayproc.terminate(leftovers)
    assert not leftovers, f"test left processes behind: {leftovers}"


def test_busy_cluster_stays_idle_cluster_removes_itself(spec: Path, rf_home: Path) -> None:
    """A running job, then a connected driver, each for twice the idle period: the cluster stays.
    Then idle: it removes itself, and status, list and teardown on this machine say so."""
    up = run_invoke("up", "--cluster", str(spec))
    assert up.returncode == 0, up.stderr
    assert f"stops itself after {IDLE_MINUTES:g} idle minutes" in up.stderr
    info = _state(rf_home, spec.stem)["info"]
    temp_dir = _state(rf_home, spec.stem)["resources"][0]["id"]
    assert _processes(temp_dir)

    job = forked_cli.run_invoke("submit", "--cluster", str(spec), "--no-wait",
                                "tests/data/sleeper.py")
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip().splitlines()[-1]
    _watcher_down_is_reported_and_up_restarts_it(spec, rf_home, temp_dir)
    # The watcher looked once a whole idle period had passed, with a job running all along.
    watcher_checked(lambda: read_json(rf_home / "autodown" / f"{spec.stem}.json"), IDLE_MINUTES)
    assert _processes(temp_dir), "a cluster running a job must not remove itself"
    status = forked_cli.run_invoke("status", "--cluster", str(spec))
    assert "autodown: busy (1 job(s) pending or running" in status.stdout, status.stdout
    assert forked_cli.run_invoke("stop-job", "--cluster", str(spec), job_id).returncode == 0

    # A driver connected from this machine (ray.init) is work too, though it runs no task.
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": info["auth_token_path"]}
    driver = subprocess.Popen(
        [sys.executable, "-c", "import ray, sys, time; ray.init(address=sys.argv[1]); "
         "print('connected', flush=True); time.sleep(120)", info["address"]],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "connected"
        watcher_checked(lambda: read_json(rf_home / "autodown" / f"{spec.stem}.json"), IDLE_MINUTES)
        assert _processes(temp_dir), "a cluster with a connected driver must not remove itself"
        marker = json.loads((rf_home / "autodown" / f"{spec.stem}.json").read_text())
        assert "driver" in marker["detail"] and marker["idle_since"] is None
    finally:
        driver.terminate()
        driver.wait(timeout=30)

    status = forked_cli.run_invoke("status", "--cluster", str(spec))
    assert status.returncode == 0, status.stderr
    _killed_watcher_comes_back_with_its_countdown(rf_home, spec.stem)
    took = _wait(lambda: not _processes(temp_dir), 120, "the idle cluster to stop itself")
    print(f"cluster gone {took:.1f}s after its last driver left (idle_minutes={IDLE_MINUTES})")
    assert took >= IDLE_MINUTES * 60 - 5, "removed before the idle period was over"

    status = forked_cli.run_invoke("status", "--cluster", str(spec), "--json")
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)
    assert reported["running"] is False and reported["state"] == "removed itself"
    assert reported["autodown"]["removed_at"]
    plain = forked_cli.run_invoke("status", "--cluster", str(spec))
    assert f"removed itself after {IDLE_MINUTES:g} idle minutes at " in plain.stdout

    listed = forked_cli.run_invoke("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["cluster"]: r for r in json.loads(listed.stdout)["clusters"]}
    assert rows[spec.stem]["state"] == "removed itself"
    assert f"removed itself after {IDLE_MINUTES:g} idle minutes" in rows[spec.stem]["autodown"]

    down = run_invoke("teardown", "--cluster", str(spec))
    assert down.returncode == 0, down.stderr
    assert f"removed itself after {IDLE_MINUTES:g} idle minutes at " in down.stderr
    assert "gone" in down.stdout
    assert not (rf_home / "state" / f"{spec.stem}.json").exists()
    assert not (rf_home / "autodown" / f"{spec.stem}.json").exists()


def _marker(rf_home: Path, name: str) -> dict:
    try:
        return json.loads((rf_home / "autodown" / f"{name}.json").read_text())
    except (OSError, ValueError):  # between the watcher's writes
        return {}


def _killed_watcher_comes_back_with_its_countdown(rf_home: Path, name: str) -> None:
    """`kill -9` of the counting watcher: its supervisor starts it again within 30 s, and the new
    one counts from the same idle start (infra/node/supervise.py, Watcher._resume)."""
    _wait(lambda: bool(_marker(rf_home, name).get("idle_since")), 30, "the idle countdown")
    before = _marker(rf_home, name)
    os.kill(int(before["pid"]), 9)
    back = _wait(lambda: _marker(rf_home, name).get("pid") not in (None, before["pid"]), 30,
                 "the watcher started again")
    after = _marker(rf_home, name)
    print(f"watcher back {back:.1f}s after kill -9")
    assert after["idle_since"] == before["idle_since"], (before, after)


def _watcher_down_is_reported_and_up_restarts_it(spec: Path, rf_home: Path, temp_dir: str) -> None:
    """Supervisor and watcher both killed: `status` says the watcher is not running, and `up`
    (by process identity, not a stale pid) starts it again."""
    from infra.node import supervise

    pidfile = Path(temp_dir) / "rayfleet-autodown.json.pid"
    found = supervise.read(pidfile)
    assert found["supervisor"] and found["child"], found
    os.kill(found["supervisor"].pid, 9)
    os.kill(found["child"].pid, 9)
    _wait(lambda: not supervise.running(pidfile), 10, "the watcher and its supervisor to die")
    status = forked_cli.run_invoke("status", "--cluster", str(spec))
    assert "autodown: watcher not running" in status.stdout, status.stdout
    again = run_invoke("up", "--cluster", str(spec))
    assert again.returncode == 0, again.stderr
    assert supervise.status(pidfile)["running"]
    _wait(lambda: _marker(rf_home, spec.stem).get("pid") == supervise.read(pidfile)["child"].pid,
          30, "the new watcher's first check")
    shown = forked_cli.run_invoke("status", "--cluster", str(spec))
    assert "watcher not running" not in shown.stdout


def test_autodown_settings_in_plan_up_and_bad_values(tmp_path: Path, rf_home: Path) -> None:
    """Lambda defaults to 60 idle minutes; `autodown: null` turns it off with a warning at `up`;
    a bad value is one line naming the field, exit 2, nothing created."""
    home = {"HOME": str(tmp_path), "LAMBDA_API_KEY": ""}  # no key anywhere: nothing can launch
    base = ("provider: lambda\nhead:\n  choices:\n    - {instance_type: gpu_1x_a10, region: "
            "us-east-1}\nworkers:\n  count: 0\nenv: none\n")
    default = tmp_path / "lamdef.yaml"
    default.write_text(base)
    plan = forked_cli.run_invoke("plan", "--cluster", str(default), env=home)
    assert plan.returncode == 1 and "no Lambda API key" in plan.stderr, plan.stderr
    assert "autodown: the whole cluster removes itself after 60 idle minutes" in plan.stdout

    off = tmp_path / "lamoff.yaml"
    off.write_text(base + "autodown: null\n")
    assert "autodown: off (autodown: null)" in forked_cli.run_invoke(
        "plan", "--cluster", str(off), env=home).stdout
    up = run_invoke("up", "--cluster", str(off), env=home)
    assert up.returncode != 0  # no API key
    assert "autodown: null — this cluster never removes itself" in up.stderr

    bad = tmp_path / "lambad.yaml"
    bad.write_text(base + "autodown: {idle_minutes: 0}\n")
    refused = run_invoke("up", "--cluster", str(bad), env=home)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: {bad}: autodown.idle_minutes: input should be greater than 0, got 0"]
    assert not (rf_home / "state" / "lambad.json").exists()

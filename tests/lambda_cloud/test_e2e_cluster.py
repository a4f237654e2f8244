"""End to end on the test bed: the fake Lambda API hands out the test-bed hosts' addresses, and
`invoke up` / `submit` / `status` / `mlflow` / `teardown` run for real (real `ray up`, real SSH,
real Ray, a real MLflow tracking server on the head).

Serve through the cluster's detached tunnel is tests/test_examples.py's and
tests/slurm/test_e2e_cluster.py's (its replica finding the tracking server there); that a Lambda
node's Ray workers get the tracking server and its login from the node's environment is this
module's MLflow job (a task on each node logs a run) and test_e2e_autoscale.py's scaling job (on
autoscaled workers)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.conftest import held_url, run_invoke
from tests.lambda_cloud.autoscale_bed import RAY_PROCESSES, power_off
from tests.lambda_cloud.conftest import API_KEY, SCALE, assert_clean, read_state
from tests.lambda_cloud.fake_api import FakeLambda
from tests.testbed import Testbed

CLUSTER = "lte2e"


@pytest.mark.slow
def test_up_submit_status_teardown_on_the_testbed(
        make_testbed: Callable[[int], Testbed], rf_home: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One cluster's whole life, step by step (each helper below checks its step)."""
    from infra.core import ssh

    bed = make_testbed(2)
    fake = FakeLambda(API_KEY, scale=SCALE, boot_delay=0.5, terminate_delay=0.2,
                      capacity={("cpu_4x_general", "us-west-1"): 2},
                      ip_pool=[host.ip for host in bed.hosts])
    fake.add_foreign_instance("prod-db")
    by_ip = {host.ip: host for host in bed.hosts}
    # Terminating an instance powers the machine off: Ray on that host stops with it.
    fake.on_terminate = lambda inst: power_off(by_ip[str(inst.ip)])
    with fake.serving(monkeypatch):
        spec = tmp_path / f"{CLUSTER}.yaml"
        spec.write_text(yaml.safe_dump({
            "provider": "lambda",
            "head": {"choices": [{"instance_type": "cpu_4x_general", "region": "us-west-1"}]},
            "workers": {"count": 1,
                        "choices": [{"instance_type": "cpu_4x_general", "region": "us-west-1"}]},
            "ssh_user": "root", "ssh_proxy_command": bed.proxy_command,
            "env": "none", "object_store_memory_mb": 100, "boot_timeout_s": 60, "ray_timeout_s": 300,
            "tracking": "mlflow",
            # No Prometheus: nothing here reads metrics (test_e2e_autoscale.py's cluster does).
            "metrics": "none",
        }))
        # The instances "boot" with the cluster's key authorized, as Lambda's would.
        bed.authorize_key(ssh.ensure_keypair(CLUSTER).public_key)

        with _timed("up"):
            _up_says_where_tracking_goes(spec, rf_home, bed)
        with _timed("submit, status"):
            worker_run = _submit_logs_a_run_per_node_and_status_counts_them(spec, bed)
        with _timed("mlflow --copy"):
            _mlflow_copy_copies_the_store_while_it_runs(spec, rf_home)
        with _timed("mlflow tunnel"):
            secret = _mlflow_tunnel_needs_the_login(spec, rf_home, bed, worker_run)
        _the_password_is_nowhere(bed, rf_home, secret)
        with _timed("dashboard"):
            _dashboard_needs_the_token(spec, rf_home, secret)
        with _timed("teardown"):
            _teardown_copies_tracking_before_it_terminates(spec, rf_home, fake, bed, worker_run)


@contextlib.contextmanager
def _timed(step: str) -> Iterator[None]:
    """Print how long a step of the cluster's life took (where this module's time goes)."""
    started = time.monotonic()
    yield
    print(f"\n[lambda cluster] {step}: {time.monotonic() - started:.1f}s", flush=True)


def _up_says_where_tracking_goes(spec: Path, rf_home: Path, bed: Testbed) -> None:
    up = run_invoke("up", "--cluster", str(spec), timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    state = read_state(rf_home, CLUSTER)
    assert state and state["info"]["head_ip"] == bed.hosts[0].ip
    # No file system in the spec: `up` says, in one line, what becomes of the tracking data.
    said = [line for line in (up.stdout + up.stderr).splitlines()
            if "goes with the cluster at autodown" in line]
    assert len(said) == 1 and "invoke teardown" in said[0], up.stdout + up.stderr


def _submit_logs_a_run_per_node_and_status_counts_them(spec: Path, bed: Testbed) -> str:
    """The MLflow run the task on the worker logged."""
    # One task per node, each logging an MLflow run; the job's code names no server or login.
    submit = run_invoke("submit", "--cluster", str(spec), "tests/data/mlflow_spread_job.py",
                        "--", "2", timeout=300)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    result = json.loads(submit.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert sorted(result["hosts"]) == sorted(host.hostname for host in bed.hosts), result
    worker_run = str(result["runs"][bed.hosts[1].hostname])

    status = run_invoke("status", "--cluster", str(spec), "--json", timeout=120)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["running"] and not report["warnings"]
    assert sorted(n["ip"] for n in report["nodes"] if n["state"] == "ALIVE") == \
        sorted(host.ip for host in bed.hosts)
    assert report["tracking"]["runs"] == 2, report["tracking"]
    assert report["tracking"]["url"].startswith("http://127.0.0.1:"), report["tracking"]
    assert report["tracking_copied_at"] is None
    assert report["tracking_copy"].startswith("tracking data never copied"), report
    # (The text `status` of this tracking server is asked once it was copied, below.)
    return worker_run


def _mlflow_copy_copies_the_store_while_it_runs(spec: Path, rf_home: Path) -> None:
    # `invoke mlflow --copy` copies the head's store here while the cluster runs (autodown
    # cannot), and `status` then says when.
    copied = run_invoke("mlflow", "--copy", "--cluster", str(spec), timeout=300)
    assert copied.returncode == 0, copied.stdout + copied.stderr
    store = rf_home / "tracking" / CLUSTER
    assert f"tracking data copied to {store}" in copied.stdout, copied.stdout
    with sqlite3.connect(store / "mlflow.db") as db:
        assert db.execute("select count(*) from runs").fetchone()[0] == 2
    # The text `status` says where the server is, its runs, and when the store was copied (the
    # note `status --json` gave as `tracking_copy` before the copy, which said "never copied").
    text = run_invoke("status", "--cluster", str(spec), timeout=120)
    assert text.returncode == 0, text.stderr
    assert "tracking: http://127.0.0.1:" in text.stdout and "(2 runs;" in text.stdout, text.stdout
    state = read_state(rf_home, CLUSTER)
    copied_at = state and state["info"]["tracking_copied_at"]
    assert copied_at and f"tracking data last copied at {copied_at} to {store}" in text.stdout, \
        text.stdout


def _mlflow_tunnel_needs_the_login(spec: Path, rf_home: Path, bed: Testbed,
                                   worker_run: str) -> str:
    """The tracking server's password (`invoke mlflow` holds a tunnel to the head's server: the
    worker's run is there, and nothing answers without the login)."""
    password = rf_home / "keys" / CLUSTER / "mlflow-password"
    assert password.stat().st_mode & 0o777 == 0o600
    secret = password.read_text().strip()
    with held_url("mlflow", "--cluster", str(spec)) as url:
        run = requests.get(f"{url}/api/2.0/mlflow/runs/get", params={"run_id": worker_run},
                           auth=("rayfleet", secret), timeout=10).json()["run"]
        assert run["data"]["metrics"][0]["key"] == "answer", run
        assert run["data"]["metrics"][0]["value"] == 42.0, run
        assert run["data"]["params"][0]["value"] == bed.hosts[1].hostname, run
        refused = requests.get(f"{url}/api/2.0/mlflow/runs/get", params={"run_id": worker_run},
                               timeout=10)
        assert refused.status_code == 401, refused.text
    return secret


def _the_password_is_nowhere(bed: Testbed, rf_home: Path, secret: str) -> None:
    # The password is on no command line of any host, in no rendered file, state or log.
    for host in bed.hosts:
        ps = host.run("ps -eo args=").stdout
        assert "mlflow server" in ps or host is not bed.hosts[0]
        assert secret not in ps, f"the tracking password is on a command line on {host.name}"
        logs = host.run(f"grep -rl {secret} /tmp/ray/session_latest/logs ~/rayfleet "
                        "~/ray_bootstrap_config.yaml 2>/dev/null || true").stdout.strip()
        assert logs == "", f"the tracking password is in {logs} on {host.name}"
    for folder in ("rendered", "state", "logs"):
        found = [str(p) for p in (rf_home / folder).rglob("*")
                 if p.is_file() and secret in p.read_text(errors="replace")]
        assert found == [], found


def _dashboard_needs_the_token(spec: Path, rf_home: Path, secret: str) -> None:
    # `invoke dashboard` keeps a tunnel to the head's dashboard open until Ctrl+C.
    with held_url("dashboard", "--cluster", str(spec)) as url:
        # Token auth: without the cluster's token the job API refuses; with it, it answers.
        assert requests.get(f"{url}/api/jobs/", timeout=10).status_code == 401
        token = rf_home / "keys" / CLUSTER / "ray-token"
        assert token.stat().st_mode & 0o777 == 0o600
        headers = {"Authorization": f"Bearer {token.read_text().strip()}"}
        jobs = requests.get(f"{url}/api/jobs/", headers=headers, timeout=10).json()
        assert [j["status"] for j in jobs] == ["SUCCEEDED"]
        # The login reaches the job's tasks through the nodes, not through its runtime env.
        assert secret not in json.dumps(jobs)


def _teardown_copies_tracking_before_it_terminates(spec: Path, rf_home: Path, fake: FakeLambda,
                                                   bed: Testbed, worker_run: str) -> None:
    store = rf_home / "tracking" / CLUSTER
    copied_before_terminate: list[bool] = []
    terminate = fake._terminate

    def spy(body: Any, now: float) -> dict[str, Any]:
        copied_before_terminate.append((store / "mlflow.db").exists())
        return terminate(body, now)

    fake._terminate = spy  # type: ignore[method-assign]
    down = run_invoke("teardown", "--cluster", str(spec), timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert copied_before_terminate and copied_before_terminate[0], copied_before_terminate
    assert f"tracking data copied to {store}" in down.stdout, down.stdout
    with sqlite3.connect(store / "mlflow.db") as db:
        rows = db.execute("SELECT key, value FROM metrics WHERE run_uuid = ?",
                          (worker_run,)).fetchall()
    assert rows == [("answer", 42.0)], rows
    assert not (rf_home / "keys" / CLUSTER).exists()
    fake.wait_powered_off()
    for host in bed.hosts:
        left = host.run(RAY_PROCESSES).stdout.strip()
        assert left == "", f"Ray still running on {host.name}: {left}"
    assert_clean(fake, CLUSTER)
    assert read_state(rf_home, CLUSTER) is None

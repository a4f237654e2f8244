"""The reference workloads in examples/, run as a user runs them: `invoke submit` on a real local
rayfleet cluster (one for the whole module, 2 CPUs, with its MLflow tracking server), plus `invoke
doctor`, the Hydra launcher and the "Train, track, serve" loop (real MLflow, real Ray Serve). The
benches whose scenario is this cluster measure on it (ON_E2E in tests/test_bench.py): the module's
`up` is bench/tracking_up.py's arm with tracking, `invoke doctor` runs through bench/doctor.py.

Sizes are the examples' small defaults (or smaller). Each test reads the `RESULT {...}` line the
example prints last and Ray's verdict on the job (`invoke submit` exits 0 only for SUCCEEDED).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import doctor as doctor_bench
from bench import local_up as local_bench
from bench import serve_deploy as serve_bench
from bench import tracking_up as tracking_bench
from infra.core import doctor, versions
from tests.conftest import ROOT, run_invoke
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

for _module in ("torch", "sklearn", "hydra", "pandas"):
    pytest.importorskip(_module, reason="the examples' extras: pip install -e '.[examples]'")


@dataclass
class Cluster:
    spec: Path
    env: dict[str, str]
    #: bench/tracking_up.py's arm with tracking: this cluster's `up`, first job, server's answer.
    tracked: tracking_bench.Run | None = None

    @property
    def bench_env(self) -> dict[str, str]:
        """The environment the benches run `invoke` in for this cluster."""
        return {**os.environ, **self.env, "RAY_USAGE_STATS_ENABLED": "0"}

    def invoke(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run_invoke(*args, env=self.env, timeout=timeout)

    def submit(self, script: str, *args: str, runtime_env: str | None = None,
               timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        flags = ["--runtime-env", runtime_env] if runtime_env else []
        done = self.invoke("submit", "--cluster", str(self.spec), *flags, script,
                           *(["--", *args] if args else []), timeout=timeout)
        assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        assert "SUCCEEDED" in done.stderr.splitlines()[-1]
        return done, result_of(done.stdout)


def result_of(stdout: str) -> dict[str, Any]:
    """The last `RESULT {...}` line an example printed."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line in:\n{stdout[-3000:]}"
    parsed: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return parsed


@pytest.fixture(scope="module")
def cluster(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("examples-cluster")
    spec = folder / f"ex-{uuid.uuid4().hex[:8]}.yaml"
    spec.write_text("provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\ntracking: mlflow\n")
    made = Cluster(spec, {"RAYFLEET_HOME": str(folder / "home")})
    # `up`, then a first job (examples/cpu_example.py) and the tracking server's first answer,
    # timed: a failed `up` ends in one line, its cluster torn down.
    made.tracked = tracking_bench.run_arm(spec, made.bench_env, folder / "home", tracking=True,
                                          keep=True)
    try:
        yield made
    finally:
        down = made.invoke("teardown", "--cluster", str(spec))
        assert down.returncode == 0, down.stdout + down.stderr
        # The tracking data outlives the local cluster, and teardown says where it is.
        store = folder / "home" / "tracking" / spec.stem
        assert f"tracking data kept in {store}" in down.stdout
        assert (store / "mlflow.db").stat().st_size > 0


# ----------------------------------------------------------------------------- invoke doctor


def test_doctor_reports_each_node_matching_this_machine(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """`invoke doctor --json`, run and timed by bench/doctor.py's measuring code (its summary
    printed: an `up` of that bench's own would repeat this module's)."""
    [run] = doctor_bench.measure(cluster.spec, cluster.bench_env, 1, "--json")
    printed = capsys.readouterr().out
    assert run.seconds > 0 and "doctor run 1: " in printed and "(exit 0)" in printed, printed
    assert re.search(r"median: [0-9.]+s over 1 runs", printed), printed
    done = run.done
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["this_machine"] == versions.node_pins()
    [node] = report["nodes"]  # the local cluster is one head node
    assert node["head"] is True and node["ok"] is True and node["mismatches"] == []
    assert node["ray_version"] == versions.node_pins()["ray_version"]
    assert versions.python_minor(node["python_version"]) == versions.node_pins()["python_version"]
    assert report["driver"]["ray_version"] == node["ray_version"]


def test_doctor_flags_mismatched_and_silent_nodes() -> None:
    pins = {"ray_version": "2.60.0", "python_version": "3.11"}
    logs = "some log line\nRESULT " + json.dumps({"driver": {}, "nodes": [
        {"node_id": "b" * 56, "ip": "10.0.0.3", "head": False, "host": "w1",
         "python_version": "3.10.14", "ray_version": "2.59.0"},
        {"node_id": "a" * 56, "ip": "10.0.0.2", "head": True, "host": "h",
         "python_version": "3.11.9", "ray_version": "2.60.0"},
        {"node_id": "c" * 56, "ip": "10.0.0.4", "head": False, "error": "no answer within 60s"},
    ]}) + "\n"
    head, worker, silent = doctor.assess(doctor.parse_result(logs), pins)
    assert head.head and head.ok
    assert worker.mismatches == ["Ray 2.59.0 (this machine: 2.60.0)",
                                 "Python 3.10 (this machine: 3.11)"]
    assert not silent.ok and silent.error == "no answer within 60s" and silent.mismatches == []


# ----------------------------------------------------------------------------- the workloads


def test_forest_trains_sequentially_and_in_parallel_with_the_cpu_runtime_env(cluster: Cluster) -> None:
    _, result = cluster.submit("examples/forest.py", "--models", "3", "--samples", "500", "--step", "5",
                               runtime_env="setup/runtime/cpu.yaml")
    assert result["models"] == 3
    # Same seeds, same data: the parallel run must reproduce the sequential one exactly.
    assert result["mse_parallel"] == result["mse_sequential"]
    assert result["best"]["mse"] == min(result["mse_parallel"])
    assert result["sequential_s"] > 0 and result["parallel_s"] > 0


def test_tpu_example_says_there_is_no_tpu_and_exits_0(cluster: Cluster) -> None:
    done, result = cluster.submit("examples/tpu_example.py", "2",
                                  runtime_env="setup/runtime/tpu.yaml")
    assert result["tpu"] is False and result["tasks"] == 0 and result["tpu_chips"] == 0
    assert result["chips_per_task"] == 4  # from setup/runtime/tpu.yaml: a v4-8 host
    assert "no TPU host to run on" in done.stdout


def test_tune_sweep_finds_a_best_config_with_asha(cluster: Cluster) -> None:
    # Two trials: one at a time on each of the cluster's two CPUs.
    _, result = cluster.submit("examples/tune_sweep.py", "--num-samples", "2", "--epochs", "2",
                               "--cpus-per-trial", "1")
    trials = result["trials"]
    assert len(trials) == 2 and result["errors"] == 0
    assert all(1 <= t["epochs"] <= 2 for t in trials)
    assert result["best_accuracy"] == max(t["accuracy"] for t in trials)
    best = result["best_config"]
    assert 1e-4 <= best["lr"] <= 1e-1 and best["batch_size"] in (16, 32, 64, 128)


def test_train_example_reports_loss_and_accuracy_per_epoch(cluster: Cluster) -> None:
    _, result = cluster.submit("examples/train_example.py", "--num-workers", "2", "--epochs", "2")
    assert result["workers"] == 2
    epochs = result["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert epochs[1]["loss"] < epochs[0]["loss"]
    assert 0.5 < result["final"]["accuracy"] <= 1.0


# ----------------------------------------------------------------------------- Hydra launcher


def _hydra(args: list[str], env: dict[str, str], cwd: Path = ROOT,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "examples/train_model.py", "--multirun", *args],
                          cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _ray_jobs(cluster: Cluster) -> dict[str, str]:
    """Each job's status as Ray's job API reports it, by submission id (the cluster's dashboard
    and token found through its state): one HTTP request, not an `invoke status` process."""
    import requests

    state = json.loads((Path(cluster.env["RAYFLEET_HOME"]) / "state" /
                        f"{cluster.spec.stem}.json").read_text())
    token = Path(state["info"]["auth_token_path"]).read_text().strip()
    jobs = requests.get(f"{state['info']['dashboard_url']}/api/jobs/", timeout=30,
                        headers={"Authorization": f"Bearer {token}"})
    assert jobs.status_code == 200, jobs.text
    return {job["submission_id"]: job["status"] for job in jobs.json() if job["submission_id"]}


def test_hydra_sweep_runs_each_job_on_the_rayfleet_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """One sweep of two jobs on the cluster: adam completes; rmsprop (no such optimizer here)
    fails there, and the sweep reports it and exits 1. (A sweep whose jobs all complete exits 0:
    test_hydra_sweep_runs_in_process_with_one_flag, through the same launcher.)"""
    done = _hydra(["hydra/launcher=ray", "optimizer.name=adam,rmsprop",
                   f"hydra.launcher.cluster={cluster.spec}", f"hydra.sweep.dir={tmp_path}/sweep"],
                  cluster.env)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "dashboard_sdk" not in done.stdout + done.stderr
    result = result_of(done.stdout)
    assert result["where"] == f"rayfleet cluster {cluster.spec}"
    runs = result["runs"]
    assert [r["overrides"] for r in runs] == [["optimizer.name=adam"], ["optimizer.name=rmsprop"]]
    completed, failed = runs
    assert completed["status"] == "COMPLETED" and 0.0 <= completed["return"] <= 1.0
    assert failed["status"] == "FAILED"
    assert failed["return"] == "ValueError: optimizer.name='rmsprop': use adam or sgd"
    assert "optimizer.name='rmsprop': use adam or sgd" in done.stderr
    # The jobs are on the cluster, as Ray reports them.
    by_id = _ray_jobs(cluster)
    assert [by_id[r["job"]] for r in runs] == ["SUCCEEDED", "FAILED"]
    # Each run's own output came back with it.
    assert "[#0] adam lr=0.001: accuracy" in done.stdout


def test_hydra_sweep_runs_in_process_with_one_flag(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    done = _hydra(["hydra/launcher=ray", "hydra.launcher.remote=false", "optimizer.lr=1e-4,1e-3",
                   f"hydra.sweep.dir={tmp_path}/sweep"],
                  {"HOME": str(home), "RAYFLEET_HOME": str(tmp_path / "no-cluster-here")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = result_of(done.stdout)
    assert result["where"] == "in-process Ray"
    assert [r["status"] for r in result["runs"]] == ["COMPLETED", "COMPLETED"]
    # The in-process Ray kept its auth token in its environment: nothing written to ~/.ray.
    assert not (home / ".ray").exists()
    assert not (tmp_path / "no-cluster-here").exists()


# ----------------------------------------------------------------------------- train, track, serve


@pytest.fixture(scope="module")
def server(cluster: Cluster) -> tuple[str, Any]:
    """The tracking server's URL (from `invoke status --json`, read once for the module: an
    `invoke` process a test is 1-2 CPU-s) and a session logged in to it."""
    import requests

    done = cluster.invoke("status", "--cluster", str(cluster.spec), "--json")
    url = json.loads(done.stdout)["tracking"]["url"]  # also while the server is still starting
    session = requests.Session()
    password = Path(cluster.env["RAYFLEET_HOME"]) / "keys" / cluster.spec.stem / "mlflow-password"
    session.auth = ("rayfleet", password.read_text().strip())
    return url, session


def _wait_answering(url: str, timeout: float = 120) -> None:

    import requests

    def healthy() -> bool:
        try:
            return requests.get(f"{url}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    wait_until(healthy, f"the tracking server at {url} to come up", timeout=timeout, interval=0.5)


@pytest.fixture(scope="module")
def trained(cluster: Cluster, server: tuple[str, Any]) -> dict[str, Any]:
    """examples/mlflow_train.py once: Ray Train, 2 workers, logging to the cluster's MLflow."""
    url, _ = server
    _wait_answering(url)  # `up` does not wait for it
    _, result = cluster.submit("examples/mlflow_train.py", "--epochs", "3", timeout=600)
    return result


def test_metrics_from_ray_train_workers_and_the_model_version_are_on_the_server(
        server: tuple[str, Any], trained: dict[str, Any]) -> None:
    url, session = server
    run = session.get(f"{url}/api/2.0/mlflow/runs/get", params={"run_id": trained["run_id"]}).json()
    params = {p["key"]: p["value"] for p in run["run"]["data"]["params"]}
    assert params["num_workers"] == "2" and params["epochs"] == "3"
    for rank in (0, 1):  # each worker process logged its own loss, every epoch
        history = session.get(f"{url}/api/2.0/mlflow/metrics/get-history",
                              params={"run_id": trained["run_id"], "metric_key": f"loss_rank{rank}"})
        assert sorted(m["step"] for m in history.json()["metrics"]) == [1, 2, 3]
    accuracy = session.get(f"{url}/api/2.0/mlflow/metrics/get-history",
                           params={"run_id": trained["run_id"], "metric_key": "test_accuracy"})
    assert len(accuracy.json()["metrics"]) == 3
    version = session.get(f"{url}/api/2.0/mlflow/model-versions/get",
                          params={"name": "digits-mlp", "version": trained["version"]})
    assert version.status_code == 200, version.text
    assert version.json()["model_version"]["run_id"] == trained["run_id"]


def test_tracking_server_refuses_requests_without_the_login(
        cluster: Cluster, server: tuple[str, Any], trained: dict[str, Any]) -> None:
    """`trained`: a job that logged to the server, whose runtime env the dashboard shows (and
    the server up: `up` does not wait for it), also when this test runs first or alone."""
    import requests

    url, session = server
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=5"
    assert requests.get(search, timeout=10).status_code == 401
    assert requests.get(search, auth=("rayfleet", "wrong"), timeout=10).status_code == 401
    assert session.get(search, timeout=10).status_code == 200
    password = session.auth[1]
    home = Path(cluster.env["RAYFLEET_HOME"])
    assert (home / "keys" / cluster.spec.stem / "mlflow-password").stat().st_mode & 0o077 == 0
    # Never in a rendered file, in state, or in a runtime env the dashboard shows.
    for path in [*home.glob("rendered/**/*"), *home.glob("state/*")]:
        assert not path.is_file() or password not in path.read_text(), path
    state = json.loads((home / "state" / f"{cluster.spec.stem}.json").read_text())
    token = Path(state["info"]["auth_token_path"]).read_text().strip()
    jobs = requests.get(f"{state['info']['dashboard_url']}/api/jobs/", timeout=10,
                        headers={"Authorization": f"Bearer {token}"})
    assert jobs.status_code == 200 and jobs.json() and password not in jobs.text


def test_serve_deploy_answers_better_than_chance_and_marks_the_cluster_busy(
        cluster: Cluster, trained: dict[str, Any]) -> None:
    from infra.node import autodown

    done = cluster.invoke("serve-deploy", "--cluster", str(cluster.spec), "examples/serve.yaml",
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    # Ray's client chatter (`INFO dashboard_sdk.py -- Uploading package ...`) goes to the log.
    assert "dashboard_sdk" not in done.stdout + done.stderr
    url = done.stdout.strip().splitlines()[-1]
    assert url == cluster.invoke("serve-url", "--cluster", str(cluster.spec), "--name",
                                 "digits").stdout.strip()
    asked = subprocess.run([sys.executable, "examples/serve_client.py", url, "--count", "100"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert asked.returncode == 0, asked.stderr
    assert result_of(asked.stdout)["accuracy"] > 0.5  # chance is 0.1
    state = json.loads((Path(cluster.env["RAYFLEET_HOME"]) / "state" /
                        f"{cluster.spec.stem}.json").read_text())
    reasons = autodown.busy_reasons(state["info"]["dashboard_url"], state["info"]["auth_token_path"])
    assert any("Serve application" in r for r in reasons), reasons
    status = cluster.invoke("status", "--cluster", str(cluster.spec))
    assert "serving: digits (RUNNING)" in status.stdout


def test_bad_serve_input_is_one_line_and_loses_nothing(cluster: Cluster, tmp_path: Path) -> None:
    import requests

    broken = tmp_path / "broken.yaml"
    broken.write_text("applications:\n  - name: [x\n")
    for target in (str(broken), "examples.serve_model:no_such_app", "examples.no_such_module:app"):
        done = cluster.invoke("serve-deploy", "--cluster", str(cluster.spec), target)
        assert done.returncode == 2, done.stdout + done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "fix the" in done.stderr, done.stderr
    url = cluster.invoke("serve-url", "--cluster", str(cluster.spec), "--name", "digits").stdout
    answer = requests.post(url.strip(), json={"inputs": [[0.0] * 64]}, timeout=60)
    assert answer.status_code == 200 and len(answer.json()["predictions"]) == 1


def test_serve_delete_removes_the_app(cluster: Cluster) -> None:
    done = cluster.invoke("serve-delete", "--cluster", str(cluster.spec), "digits")
    assert done.returncode == 0, done.stdout + done.stderr
    listed = cluster.invoke("serve-status", "--cluster", str(cluster.spec), "--json")
    assert json.loads(listed.stdout) == []


def test_bench_serve_deploy_measures_on_this_cluster(
        cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/serve_deploy.py's measuring code, one run, on this module's cluster (tests/test_bench.py's
    ON_E2E: an `up` of its own would repeat this module's); it prints its summary line, and Serve
    is left with no application."""
    [ratio] = serve_bench.measure(cluster.spec, cluster.bench_env, 1, tmp_path)
    printed = capsys.readouterr().out
    assert ratio > 0
    assert re.search(r"median ratio invoke serve-deploy / serve deploy \(to first answer\): "
                     r"[0-9.]+", printed), printed
    listed = cluster.invoke("serve-status", "--cluster", str(cluster.spec), "--json")
    assert json.loads(listed.stdout) == []


def test_bench_tracking_up_and_local_up_measure_beside_this_cluster(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/tracking_up.py's pair and bench/local_up.py's raw starts (ON_E2E in
    tests/test_bench.py): the arm with tracking is this module's own `up` (the fixture), the arm
    without is a plain cluster started beside it, whose start script local_up.py then runs by
    hand (after its teardown) to time a raw `ray start` against that `up` (not also Ray's own
    `ray` script: a third Ray head for a ratio nothing asserts)."""
    assert cluster.tracked is not None
    home = Path(cluster.env["RAYFLEET_HOME"])
    plain = cluster.spec.with_name(f"plain-{uuid.uuid4().hex[:6]}.yaml")
    plain.write_text("provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n")
    off = tracking_bench.run_arm(plain, cluster.bench_env, home, tracking=False, keep=True)
    ratios = local_bench.measure(plain, cluster.bench_env, off.up, stock=False)
    print(tracking_bench.pair_line("pair 1", off, cluster.tracked, tracked_first=True))
    tracking_bench.summary([(off, cluster.tracked)])
    local_bench.summary([ratios])
    printed = capsys.readouterr().out
    print(printed)  # the numbers, for -s and for the log of a failing run
    assert cluster.tracked.answered is not None, printed  # the server answered after `up`
    assert off.answered is None and off.up > 0 and off.first_job > 0
    assert re.search(r"median ratio up with tracking / without: [0-9.]+ \(target", printed)
    assert re.search(r"median ratio invoke up / raw ray start: [0-9.]+ \(the same", printed)
    assert "server answered after" in printed
    assert not (home / "state" / f"{plain.stem}.json").exists()  # local_up tore it down


def test_a_dead_tracking_server_is_one_line_and_up_brings_it_back_with_its_runs(
        cluster: Cluster, server: tuple[str, Any], trained: dict[str, Any]) -> None:
    import requests

    from infra.core.tracking import client as tracking
    from infra.node import rayproc

    url, logged_in = server
    state = json.loads((Path(cluster.env["RAYFLEET_HOME"]) / "state" /
                        f"{cluster.spec.stem}.json").read_text())
    config = Path(state["resources"][0]["id"]) / tracking.CONFIG_FILE
    processes = rayproc.cluster_processes([str(config)])
    assert processes and not rayproc.terminate(processes)
    done = cluster.invoke("mlflow", "--cluster", str(cluster.spec))
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "not answering" in done.stderr and "invoke up" in done.stderr
    status = cluster.invoke("status", "--cluster", str(cluster.spec))
    assert "did not answer (starting, or died)" in status.stderr and "invoke up" in status.stderr
    again = cluster.invoke("up", "--cluster", str(cluster.spec))
    assert again.returncode == 0, again.stdout + again.stderr
    _wait_answering(url)
    # A new connection (the module's session may hold one to the server that was ended).
    run = requests.get(f"{url}/api/2.0/mlflow/runs/get", params={"run_id": trained["run_id"]},
                       auth=logged_in.auth, timeout=30)
    assert run.status_code == 200 and run.json()["run"]["info"]["status"] == "FINISHED"

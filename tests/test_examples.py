"""The reference workloads in examples/, run as a user runs them: `invoke submit` on a real local
rayfleet cluster (one for the whole module, 2 CPUs), plus `invoke doctor` and the Hydra launcher.

Sizes are the examples' small defaults (or smaller). Each test reads the `RESULT {...}` line the
example prints last and Ray's verdict on the job (`invoke submit` exits 0 only for SUCCEEDED).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra import doctor, versions
from tests.conftest import ROOT, run_invoke

pytestmark = pytest.mark.slow

for _module in ("torch", "sklearn", "hydra", "pandas"):
    pytest.importorskip(_module, reason="the examples' extras: pip install -e '.[examples]'")


@dataclass
class Cluster:
    spec: Path
    env: dict[str, str]

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
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("examples-cluster")
    spec = folder / f"ex-{uuid.uuid4().hex[:8]}.yaml"
    spec.write_text("provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n")
    made = Cluster(spec, {"RAYFLEET_HOME": str(folder / "home")})
    up = made.invoke("up", "--cluster", str(spec))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield made
    finally:
        down = made.invoke("teardown", "--cluster", str(spec))
        assert down.returncode == 0, down.stdout + down.stderr


# ----------------------------------------------------------------------------- invoke doctor


def test_doctor_reports_each_node_matching_this_machine(cluster: Cluster) -> None:
    done = cluster.invoke("doctor", "--cluster", str(cluster.spec), "--json")
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
    _, result = cluster.submit("examples/forest.py", "--models", "3", "--samples", "1500",
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
    _, result = cluster.submit("examples/tune_sweep.py", "--num-samples", "4", "--epochs", "2",
                               "--cpus-per-trial", "1")
    trials = result["trials"]
    assert len(trials) == 4 and result["errors"] == 0
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


def test_hydra_sweep_runs_each_job_on_the_rayfleet_cluster(cluster: Cluster, tmp_path: Path) -> None:
    done = _hydra(["hydra/launcher=ray", "optimizer.lr=1e-4,1e-3",
                   f"hydra.launcher.cluster={cluster.spec}", f"hydra.sweep.dir={tmp_path}/sweep"],
                  cluster.env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = result_of(done.stdout)
    assert result["where"] == f"rayfleet cluster {cluster.spec}"
    runs = result["runs"]
    assert [r["overrides"] for r in runs] == [["optimizer.lr=0.0001"], ["optimizer.lr=0.001"]]
    assert all(r["status"] == "COMPLETED" and 0.0 <= r["return"] <= 1.0 for r in runs)
    # The jobs are on the cluster, as Ray reports them (found through the cluster's state).
    status = json.loads(cluster.invoke("status", "--cluster", str(cluster.spec), "--json").stdout)
    by_id = {job["job"]: job["status"] for job in status["jobs"]}
    assert [by_id[r["job"]] for r in runs] == ["SUCCEEDED", "SUCCEEDED"]
    # Each run's own output came back with it.
    assert "[#1] adam lr=0.001: accuracy" in done.stdout


def test_hydra_reports_a_job_that_fails_on_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    done = _hydra(["hydra/launcher=ray", "optimizer.name=rmsprop",
                   f"hydra.launcher.cluster={cluster.spec}", f"hydra.sweep.dir={tmp_path}/sweep"],
                  cluster.env)
    assert done.returncode == 1
    [run] = result_of(done.stdout)["runs"]
    assert run["status"] == "FAILED"
    assert run["return"] == "ValueError: optimizer.name='rmsprop': use adam or sgd"
    assert "optimizer.name='rmsprop': use adam or sgd" in done.stderr


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

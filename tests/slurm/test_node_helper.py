"""The program the batch script runs on the nodes, run here as the script runs it (`python -m`
from the shipped node zip)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.node import rayproc
from infra.node.slurm import node_helper
from infra.providers.slurm.spec import PORT_STRIDE
from tests.slurm.nodezip import helper, helper_env, zip_path
from tests.waiting import wait_until


def _free_pair() -> int:
    """A base whose block and the next one are both free now."""
    for base in range(27000, 31000, PORT_STRIDE):
        if rayproc.block_is_free(rayproc.PortBlock(base)) and rayproc.block_is_free(
                rayproc.PortBlock(base + PORT_STRIDE)):
            return base
    pytest.skip("no two free port blocks between 27000 and 31000")


def test_the_helper_runs_from_the_zip_alone(tmp_path: Path) -> None:
    """The nodes have no rayfleet: with no site-packages (-S) and another working directory,
    the zip alone (plus Ray's folder, for psutil) carries the helper and all it imports."""
    import ray

    (tmp_path / "ray").symlink_to(Path(ray.__file__).parent)
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import sys, infra.node.slurm.node_helper as h; "
         "print(h.__file__); sys.exit(h.main(['no-such-command']))"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=helper_env({"PYTHONPATH": str(tmp_path)}))
    assert done.returncode == 2 and "unknown command 'no-such-command'" in done.stderr, done.stderr
    assert done.stdout.startswith(str(zip_path()) + os.sep), done.stdout
    # The batch script's copy of what it runs is the zip, not glued source.
    assert "def embedded_source(" not in Path(node_helper.__file__).read_text()


def test_the_helper_leaves_the_jobs_pythonpath_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rf_helper` puts the zip first on PYTHONPATH; `ray start` (in the helper's process) must
    pass on the PYTHONPATH the job had, the autoscaling head's own copy of the zip included."""
    zip_ = str(zip_path())
    for before, after in [(f"{zip_}:/job/lib", "/job/lib"), (f"{zip_}:{zip_}:/x", f"{zip_}:/x"),
                          ("/job/lib", "/job/lib"), (zip_, None)]:
        monkeypatch.setenv("RF_PY", zip_)
        monkeypatch.setenv("PYTHONPATH", before)
        node_helper.leave_path()
        assert os.environ.get("PYTHONPATH") == after, before


def test_prepare_takes_the_job_block_or_the_next_free_one(tmp_path: Path) -> None:
    base = _free_pair()
    info = tmp_path / "job.json"
    env = {"RF_JOB_ID": "4", "RF_HEAD_IP": "127.0.0.1", "RF_TOTAL": "2"}
    # Job 4 with 2 blocks picks block 4 % 2 = 0, i.e. `base`.
    done = helper("prepare", str(info), str(base), str(PORT_STRIDE), "2", env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == base
    written = json.loads(info.read_text())
    assert written["phase"] == "starting" and "2 node(s)" in written["message"]
    assert written["gcs_port"] == base and written["dashboard_port"] == base + 1
    assert written["dashboard_url"] == f"http://127.0.0.1:{base + 1}"
    # Someone else listens on the object manager port of that block: the next block is taken.
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", base + 4))
        squatter.listen()
        done = helper("prepare", str(info), str(base), str(PORT_STRIDE), "2", env=env)
    assert int(done.stdout) == base + PORT_STRIDE


def test_prepare_fails_in_one_line_when_no_block_is_free(tmp_path: Path) -> None:
    base = _free_pair()
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", base + 16))
        squatter.listen()
        done = helper("prepare", str(tmp_path / "i.json"), str(base), str(PORT_STRIDE), "1",
                      env={"RF_JOB_ID": "7"})
    assert done.returncode != 0
    assert done.stderr.strip() == f"rayfleet: no free block of Ray ports from {base} on this node"


@pytest.fixture
def marked() -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """Processes naming one job's temp dir (one with a child), and one of a neighbouring job."""
    job = f"/tmp/rf-t{uuid.uuid4().hex[:6]}"
    ours = f"{job}.0"
    Path(ours).mkdir()
    parent = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "time.sleep(120)\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", parent, f"--temp-dir={ours}"]),
        # Same prefix, another node index: must survive (boundary-aware match).
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", f"{job}.01/x"]),
    ]
    try:
        yield ours, procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_stop_ends_only_this_jobs_processes_and_their_children(
        marked: tuple[str, list[subprocess.Popen[bytes]]]) -> None:
    ours, (parent, neighbour) = marked
    targets = wait_until(lambda: found if (found := rayproc.cluster_processes([ours]))[1:] else None,
                         "the job's process and its child", timeout=10, interval=0.05)
    assert parent.pid in targets and len(targets) == 2
    started = time.monotonic()
    done = helper("stop", ours)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 5, "stopping must be quick"
    assert not any(rayproc.alive(pid) for pid in targets)
    assert neighbour.poll() is None, "another job's process was touched"
    assert not Path(ours).exists(), "the job's temp dir must be removed"


def test_each_node_takes_its_own_free_block_from_the_heads(tmp_path: Path) -> None:
    base = _free_pair()
    env = {"RF_PORT_FIRST": str(base), "RF_PORT_STRIDE": str(PORT_STRIDE), "RF_PORT_BLOCKS": "2"}
    done = helper("block", str(base), env=env)
    assert done.returncode == 0 and int(done.stdout) == base, done.stderr
    # A port of the head's block held on this node (the node manager's): the next block.
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", base + 3))
        squatter.listen()
        done = helper("block", str(base), env=env)
    assert int(done.stdout) == base + PORT_STRIDE


def test_the_nodes_find_psutil_in_rays_own_copy(tmp_path: Path) -> None:
    """A node's Python has Ray (which ships psutil in ray/thirdparty_files) but maybe no psutil of
    its own: the helper finds Ray's copy without importing Ray. Here: no site-packages (-S), only
    Ray's package on the path."""
    import ray

    (tmp_path / "ray").symlink_to(Path(ray.__file__).parent)
    marker = f"/tmp/rf-helper-test-{uuid.uuid4().hex}"
    sleeper = subprocess.Popen(["sleep", "30", marker])
    try:
        done = helper("stop", marker, python=(sys.executable, "-S"),
                      env={"PYTHONPATH": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        assert sleeper.wait(timeout=10) != 0  # found through psutil and stopped
    finally:
        sleeper.kill()
        sleeper.wait()


def test_metrics_config_names_the_heads_address_block_discovery_file_and_store(
        tmp_path: Path) -> None:
    base = _free_pair()
    store = tmp_path / "work" / "metrics" / "c1"
    target = tmp_path / "head" / "rayfleet-metrics.json"
    target.parent.mkdir()
    env = {"RF_HEAD_IP": "10.0.0.7", "RF_BASE": str(base), "RF_HEAD_TEMP": str(target.parent)}
    done = helper("metrics-config", str(target), str(store), "7", "300", "4", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(target.read_text()) == {
        "host": "127.0.0.1", "port": rayproc.PortBlock(base).prometheus,
        "discovery_file": str(target.parent / "ray" / "prom_metrics_service_discovery.json"),
        "storage_dir": str(store / "tsdb"), "retention_days": 7, "retention_size_mb": 300,
        "scrape_interval_s": 4, "log_path": str(store / "prometheus.log"), "version": 1}
    assert store.stat().st_mode & 0o777 == 0o700
    # The info file says which Prometheus the head runs, for `up` (RF_METRICS: the spec's).
    info = tmp_path / "job.json"
    helper("prepare", str(info), str(base), str(PORT_STRIDE), "1",
           env={"RF_JOB_ID": "0", "RF_METRICS": "1"})
    assert json.loads(info.read_text())["prometheus"].endswith("prometheus")
    helper("prepare", str(info), str(base), str(PORT_STRIDE), "1", env={"RF_JOB_ID": "0"})
    assert json.loads(info.read_text())["prometheus"] is None  # metrics off: none asked for


def test_no_prometheus_on_the_head_is_one_line_and_no_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from infra.node import metrics

    # A node without the distribution's package: nothing on PATH, beside Python, or in /usr/bin.
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(metrics, "FALLBACK_PROGRAMS", ())
    monkeypatch.setenv("RF_METRICS", "1")
    target = tmp_path / "rayfleet-metrics.json"
    assert node_helper.metrics_config(str(target), str(tmp_path / "store"), 30, 1024, 10) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "no `prometheus`" in said[0] and "without metrics" in said[0], said
    assert not target.exists() and not (tmp_path / "store").exists()
    node_helper.prometheus_program.cache_clear()
    assert node_helper.info_now("starting").prometheus == ""
    node_helper.prometheus_program.cache_clear()

"""`tracking: mlflow` on Lambda without a cluster: what the rendered files carry (a path, never the
password), the snapshot a teardown takes, what `status` says of it, and a teardown whose head does
not answer (one line, and everything still goes). The running server is in test_e2e_cluster.py."""

from __future__ import annotations

import sqlite3
import tarfile
from pathlib import Path

import yaml

from infra.cli.loading import load_spec
from infra.core import node_start, state
from infra.core.tracking import client as tracking
from infra.core.tracking import remote as tracking_remote
from infra.node import tracking_snapshot
from infra.providers.lambda_cloud import autoscale, raycluster, users
from infra.providers.lambda_cloud.records import Instance
from infra.providers.lambda_cloud.spec import Spec
from tests import node_conf
from tests.conftest import run_invoke
from tests.lambda_cloud.conftest import SpecFactory, assert_clean, read_state
from tests.lambda_cloud.fake_api import FakeLambda
from tests.lambda_cloud.test_faults import provision


def _spec(tmp_path: Path, **changes: object) -> Spec:
    data = {"provider": "lambda", "tracking": "mlflow",
            "head": {"choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}]},
            "workers": {"count": 1, "choices": [{"instance_type": "gpu_1x_a10",
                                                 "region": "us-east-1"}]}, **changes}
    path = tmp_path / "tr.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(path)
    assert isinstance(spec, Spec)
    return spec


def test_every_ray_start_reads_the_password_from_the_nodes_file(rf_home: Path,
                                                                tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    secret = tracking.ensure_credentials("tr").read_text().strip()
    text = raycluster.render_config(spec, "203.0.113.5", ["203.0.113.6"], tmp_path / "key", "abc",
                                    "10.0.0.5")
    config = yaml.safe_load(text)
    assert config["file_mounts"]["~/.rayfleet/mlflow-password"] == str(tracking.password_path("tr"))
    # Each start line is node.sh; its node.conf holds the words Ray's user's shell runs first.
    conf = raycluster.node_conf(spec, "10.0.0.5")
    for role in ("head", "worker"):
        words = node_conf.words(conf, role)
        assert "MLFLOW_TRACKING_URI=http://10.0.0.5:5000 " in words, words
        assert "MLFLOW_TRACKING_USERNAME=rayfleet " in words, words
        assert 'MLFLOW_TRACKING_PASSWORD="$(cat "$HOME/.rayfleet/mlflow-password")" ' in words
    assert secret not in text + conf
    # An autoscaled worker gets the head's copy of the file (in the worker kit, its one file
    # mount besides the node env's installer) and the same words.
    autoscaler = autoscale.render_config(spec, "abc", "me", "us-east-1", "key", ["rs"], None, 1.0,
                                         "10.0.0.5")
    data = yaml.safe_load(autoscaler)
    kit = f"~/{users.WORKER_KIT}"
    assert data["file_mounts"][kit] == kit
    assert set(data["file_mounts"]) <= {kit, raycluster.REMOTE_SETUP}, data["file_mounts"]
    assert data["worker_start_ray_commands"] == [node_start.command("worker", kit)]
    auto_conf = autoscale.node_conf(spec, "i-1", "10.0.0.5")
    files = users.kit_files(b"t0ken", secret.encode(), auto_conf)
    assert files[f"{users.WORKER_KIT}/.rayfleet/mlflow-password"] == (secret.encode(), 0o600)
    assert files[f"{users.WORKER_KIT}/{node_start.CONF}"] == (auto_conf.encode(), 0o644)
    assert node_conf.array(auto_conf, "worker_files") == ["ray:.rayfleet/ray-token",
                                                          "ray:.rayfleet/mlflow-password"]
    assert "MLFLOW_TRACKING_URI=http://10.0.0.5:5000 " in node_conf.words(auto_conf, "worker")
    head = autoscale.head_start_command(spec, "i-1", "10.0.0.5")
    assert head.startswith(node_start.command("head") + " && ")
    assert 'MLFLOW_TRACKING_PASSWORD="$(cat "$HOME/.rayfleet/mlflow-password")"' in \
        node_conf.words(auto_conf, "head")
    assert secret not in autoscaler + head + auto_conf
    # Without tracking, nothing of it.
    plain = raycluster.render_config(_spec(tmp_path, tracking="none"), "203.0.113.5", [],
                                     tmp_path / "key", "abc", "10.0.0.5")
    assert "MLFLOW" not in plain and "mlflow-password" not in plain


def test_the_snapshot_is_a_consistent_copy_of_runs_and_artifacts(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "artifacts" / "1" / "run").mkdir(parents=True)
    (store / "artifacts" / "1" / "run" / "model.txt").write_text("weights")
    (store / "auth.db").write_text("users")
    with sqlite3.connect(store / "mlflow.db") as db:
        db.execute("CREATE TABLE metrics (key TEXT, value REAL)")
        db.execute("INSERT INTO metrics VALUES ('loss', 0.5)")
    # A writer holding an open transaction: the backup sees the last committed state.
    writer = sqlite3.connect(store / "mlflow.db")
    writer.execute("INSERT INTO metrics VALUES ('loss', 0.25)")
    out = tmp_path / "snap.tar"
    tracking_snapshot.snapshot(store, out)
    writer.rollback()
    writer.close()
    assert out.stat().st_mode & 0o777 == 0o600
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["artifacts", "artifacts/1", "artifacts/1/run",
                                          "artifacts/1/run/model.txt", "mlflow.db"]
        # `filter=` came in Python 3.11.4 (Debian 12's python3 is 3.11.2); this tar is our own.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path / "copy", **safe)
    with sqlite3.connect(tmp_path / "copy" / "mlflow.db") as db:
        assert db.execute("SELECT key, value FROM metrics").fetchall() == [("loss", 0.5)]
    assert tracking_snapshot.main(["--store", str(tmp_path / "nothing"), "--out", str(out)]) == 3


def test_status_says_where_the_tracking_data_is_safe(rf_home: Path) -> None:
    current = state.State.new(state.state_path("tr"), "tr", "lambda")
    assert tracking_remote.copy_note(current) is None  # no store on a head
    current.set_info(tracking_head_store="/root/rayfleet/tracking")
    assert "never copied" in str(tracking_remote.copy_note(current))
    current.set_info(tracking_copied_at="2026-01-02T03:04:05+00:00")
    note = str(tracking_remote.copy_note(current))
    assert "last copied at 2026-01-02T03:04:05+00:00" in note and str(rf_home / "tracking" / "tr") \
        in note
    current.set_info(tracking_head_store="/lambda/nfs/shared/rayfleet-tracking/tr",
                     tracking_durable="Lambda file system 'shared'")
    assert "Lambda file system 'shared'" in str(tracking_remote.copy_note(current))


def test_a_durable_store_keeps_its_password_through_teardown(rf_home: Path) -> None:
    password = tracking.ensure_credentials("tr")
    (password.parent / "id_ed25519").write_text("key")
    current = state.State.new(state.state_path("tr"), "tr", "lambda")
    current.set_info(tracking_head_store="/lambda/nfs/fs/x", tracking_durable="Lambda file system")
    tracking_remote.remove_keys(current, password.parent)
    assert sorted(p.name for p in password.parent.iterdir()) == ["mlflow-flask-secret",
                                                                  "mlflow-password"]
    current.set_info(tracking_durable=None)
    tracking_remote.remove_keys(current, password.parent)
    assert not password.parent.exists()


def test_teardown_with_an_unreachable_head_says_so_in_one_line_and_removes_everything(
        fake: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    path = make_spec("lt", tracking="mlflow")
    provision(path)
    with state.locked("lt", "lambda", "up") as current:
        head = next(r for r in current.resources(Instance) if r.attrs.name.endswith("head"))
        current.set_info(head_ip=head.attrs.ip, tracking_head_store="/root/rayfleet/tracking")
    # The head stops answering SSH (nothing listens where the proxy command now points).
    data = yaml.safe_load(path.read_text())
    data["ssh_proxy_command"] = "nc 127.0.0.1 9"
    path.write_text(yaml.safe_dump(data))
    down = run_invoke("teardown", "--cluster", str(path), timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    lines = [line for line in (down.stdout + down.stderr).splitlines() if "tracking data" in line]
    assert len(lines) == 1, lines
    assert "NOT copied" in lines[0] and "goes with the cluster" in lines[0], lines
    assert_clean(fake)
    assert read_state(rf_home) is None


def test_plan_says_where_the_store_lives(fake: FakeLambda, make_spec: SpecFactory,
                                         rf_home: Path) -> None:
    fake.add_file_system("shared", "us-east-1")
    on_head = run_invoke("plan", "--cluster", str(make_spec("lt", tracking="mlflow")), timeout=120)
    assert on_head.returncode == 0, on_head.stdout + on_head.stderr
    assert "MLflow tracking server on the head's private address, port 5000" in on_head.stdout
    assert "goes with the cluster at autodown" in on_head.stdout, on_head.stdout
    durable = run_invoke("plan", "--cluster", str(make_spec("lt", tracking="mlflow",
                                                             file_system="shared")), timeout=120)
    assert durable.returncode == 0, durable.stdout + durable.stderr
    assert "its store on Lambda file system 'shared', which outlives the cluster" in durable.stdout


def test_a_file_system_in_the_spec_holds_the_store(fake: FakeLambda, make_spec: SpecFactory,
                                                   rf_home: Path) -> None:
    from infra.node.lambda_cloud import api
    from infra.providers.lambda_cloud import services

    fake.add_file_system("shared", "us-east-1")
    client = api.LambdaClient.from_env()
    durable = load_spec(make_spec("lt", tracking="mlflow", file_system="shared"))
    assert isinstance(durable, Spec)
    # Lambda's listing names the mount point (the fake: /lambda/nfs/<name>, as the OpenAPI file).
    assert services.store(durable, client) == tracking_remote.HeadStore(
        "/lambda/nfs/shared/rayfleet-tracking/lt", "Lambda file system 'shared'")
    on_head = load_spec(make_spec("lt", tracking="mlflow"))
    assert isinstance(on_head, Spec)
    assert services.store(on_head, client) == tracking_remote.HeadStore("rayfleet/tracking")

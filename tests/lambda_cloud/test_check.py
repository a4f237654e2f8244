"""`invoke check` on this machine: the local provider, Lambda against the fake API (with and
without a key), GCP without credentials (no request made) and Slurm through a login host that is
the fake bed's loopback sshd (a key it refuses, then one it takes), each with its fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT
from tests.forked_cli import run_invoke
from tests.lambda_cloud.conftest import API_KEY
from tests.lambda_cloud.fake_api import FakeLambda
from tests.lambda_cloud.sshd import LocalSshd


def _clusters(tmp_path: Path, sshd: LocalSshd, key: Path) -> Path:
    folder = tmp_path / "clusters"
    folder.mkdir()
    shutil.copy(ROOT / "clusters" / "local.yaml", folder / "local.yaml")
    shutil.copy(ROOT / "clusters" / "lambda.yaml", folder / "lambda.yaml")
    (folder / "gcp-tpu.yaml").write_text("provider: gcp-tpu\nproject: test-project\n"
                                         "zone: us-central2-b\n")
    known = tmp_path / "known_hosts"
    (folder / "slurm.yaml").write_text(yaml.safe_dump({
        "provider": "slurm", "nodes": 1, "cpus_per_node": 1,
        "submit": {"host": "127.0.0.1", "port": sshd.port, "user": "root", "key": str(key),
                   "known_hosts": str(known), "host_key_policy": "accept-new",
                   "slurm_conf": str(tmp_path / "no-such-slurm.conf")}}))
    return folder


def _check(clusters: Path, home: Path, **env: str) -> dict[str, Any]:
    done = run_invoke("check", "--json", env={"RAYFLEET_CLUSTERS": str(clusters),
                                              "RAYFLEET_HOME": str(home), **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return {entry["provider"]: entry for entry in json.loads(done.stdout)}


def _row(entry: dict[str, Any], what: str) -> dict[str, Any]:
    return next(r for r in entry["checks"] if r["what"] == what)


def test_check_says_what_each_provider_needs(fake: FakeLambda, sshd: LocalSshd, rf_home: Path,
                                             tmp_path: Path) -> None:
    from infra.core import ssh

    key = ssh.ensure_keypair("checker").private_path  # not authorized on the login host yet
    clusters = _clusters(tmp_path, sshd, key)
    found = _check(clusters, rf_home, HOME=str(tmp_path))
    assert found["local"]["usable"] and _row(found["local"], "Ray CLI")["ok"]
    assert found["lambda"]["usable"], found["lambda"]
    assert _row(found["lambda"], "Lambda API")["detail"].startswith(fake.url)
    assert _row(found["lambda"], "ssh client")["ok"] and _row(found["lambda"], "rsync")["ok"]
    credentials = _row(found["gcp-tpu"], "Google credentials")
    assert not credentials["ok"] and "gcloud auth application-default login" in credentials["fix"]
    login = _row(found["slurm"], "login host")
    assert not login["ok"] and "ssh root@127.0.0.1" in login["fix"], login

    sshd.authorize(ssh.ensure_keypair("checker").public_key, restrict=False)
    again = _check(clusters, rf_home, HOME=str(tmp_path), LAMBDA_API_KEY="")
    key_row = _row(again["lambda"], "API key")
    assert not key_row["ok"] and "LAMBDA_API_KEY" in key_row["fix"]
    assert [r["what"] for r in again["lambda"]["checks"]] == ["API key", "ssh client", "rsync"]
    # Logged into the login host (this machine, through sshd): Slurm's commands are judged there.
    assert _row(again["slurm"], "login host")["ok"]
    conf = _row(again["slurm"], "Slurm configuration")
    assert not conf["ok"] and "no-such-slurm.conf is not readable" in conf["detail"], conf
    assert "submit.slurm_conf" in conf["fix"]
    assert API_KEY not in json.dumps(again) + json.dumps(found)


def test_check_table_has_one_row_per_missing_piece(rf_home: Path, tmp_path: Path) -> None:
    done = run_invoke("check", env={"LAMBDA_API_KEY": "", "HOME": str(tmp_path)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "local (ready)" in done.stdout and "lambda (NOT ready)" in done.stdout
    assert "MISSING" in done.stdout and "…" not in done.stdout
    assert done.stderr.strip().startswith("ready: local")

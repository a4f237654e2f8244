"""`invoke list` with one cluster of each provider, one provider's endpoint down.

local: a real Ray head; Slurm: a real single-node Slurm (test bed) running a real cluster; Lambda:
the fake API with the cluster's head instance in it; GCP: an endpoint that refuses connections (the
provider that is down). The listing must show a row per cluster, the down one saying so, the others
correct, and exit 0 with a warning; it must not wait for the dead endpoint's retries.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from infra.core.state import State
from infra.node import rayproc
from infra.node.lambda_cloud import api
from infra.node.slurm import autodown as slurm_autodown
from infra.providers.gcp_tpu.records import Cluster
from infra.providers.lambda_cloud.records import Instance
from tests.conftest import run_invoke
from tests.gcp_tpu.conftest import write_service_account_key
from tests.lambda_cloud.fake_api import FakeLambda
from tests.slurm.conftest import SMALL
from tests.testbed.slurm import LocalSlurm
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

API_KEY = "secret_lambda_LISTTEST_0123456789"
SCALE = 0.01
TIMEOUT = 4


@pytest.fixture
def lambda_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLambda]:
    server = FakeLambda(API_KEY, scale=SCALE, boot_delay=0.1, terminate_delay=0.1,
                        capacity={("gpu_1x_a10", "us-east-1"): 4})
    server.add_foreign_instance("someone-elses")
    with server.serving(monkeypatch):
        yield server


def _lambda_cluster(fake: FakeLambda, specs: Path, home: Path) -> None:
    """A Lambda cluster whose head runs in the fake, recorded in state as `up` records it."""
    (specs / "lam.yaml").write_text(yaml.safe_dump({
        "provider": "lambda",
        "head": {"choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}]},
        "workers": {"count": 0, "choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}]},
        "env": "none"}))
    current = State.new(home / "state" / "lam.json", "lam", "lambda")
    client = api.LambdaClient(API_KEY, fake.url, api.Limits.scaled(SCALE))
    client.add_ssh_key("lam-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq6yJ7c0l3pB0vX1listtest")
    tags = [{"key": "rayfleet-cluster", "value": current.cluster_id},
            {"key": "rayfleet-owner", "value": current.owner},
            {"key": "rayfleet-name", "value": "lam"}, {"key": "rayfleet-node", "value": "head"}]
    launched = client.request("POST", "/instance-operations/launch", {
        "region_name": "us-east-1", "instance_type_name": "gpu_1x_a10",
        "ssh_key_names": ["lam-key"], "name": "lam-head", "tags": tags}, launch=True)
    an_hour_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    current.add(launched["instance_ids"][0], Instance(
        name="lam-head", instance_type="gpu_1x_a10", region="us-east-1", price_cents_per_hour=75,
        launched_at=an_hour_ago.isoformat(timespec="seconds"), slot="head", run="test"))
    current.set_info(spec_path=str(specs / "lam.yaml"))
    wait_until(lambda: all(i["status"] == "active" for i in fake.inventory()),
               "every instance to be active", timeout=30, interval=0.05)


def _gcp_cluster(specs: Path, home: Path, tmp_path: Path) -> None:
    """A GCP cluster in state whose API endpoint is down."""
    key = write_service_account_key(tmp_path / "sa.json")
    (specs / "tpus.yaml").write_text(yaml.safe_dump({
        "provider": "gcp-tpu", "project": "test-project", "zone": "us-central2-b",
        "credentials_file": str(key)}))
    current = State.new(home / "state" / "tpus.json", "tpus", "gcp-tpu")
    current.add("tpus", Cluster(project="test-project", zone="us-central2-b",
                                credentials_file=str(key), ssh_user="ubuntu", dashboard_port=8265))
    current.set_info(spec_path=str(specs / "tpus.yaml"))


def test_list_four_providers_one_down(rf_home: Path, tmp_path: Path, lambda_fake: FakeLambda,
                                      slurm_local: LocalSlurm,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    monkeypatch.setenv("RAYFLEET_CLUSTERS", str(specs))
    monkeypatch.setenv("RAYFLEET_GCP_API_ENDPOINT", f"http://127.0.0.1:{rayproc.free_port()}/")
    (specs / "loc.yaml").write_text("provider: local\nnum_cpus: 1\nobject_store_memory_mb: 100\n")
    (specs / "hpc.yaml").write_text(
        f"provider: slurm\nsubmit:\n  slurm_conf: {slurm_local.conf_path}\n"
        f"  workdir: {slurm_local.jobs_dir}\n{SMALL}autodown: {{idle_minutes: 45}}\n")
    _lambda_cluster(lambda_fake, specs, rf_home)
    _gcp_cluster(specs, rf_home, tmp_path)
    try:
        began = time.monotonic()
        with ThreadPoolExecutor(2) as pool:  # side by side: the test pays for the slower one only
            ups = list(pool.map(lambda name: run_invoke("up", "--cluster", name), ("loc", "hpc")))
        for up in ups:
            assert up.returncode == 0, up.stderr
        print(f"both clusters up in {time.monotonic() - began:.1f}s")
        # `up` does not wait for the Slurm head's idle watcher to report (a busy machine can take
        # a while): the autodown column below is the watcher's first report, so wait for it. Its
        # marker file, beside the head in the job (on this machine: the bed's one node), is what
        # `status` reads; watched here, not through an `invoke status` process every second.
        head = next(r["attrs"] for r in json.loads((rf_home / "state" / "hpc.json").read_text())
                    ["resources"] if r["attrs"].get("temp_dir"))
        marker = Path(head["temp_dir"]) / slurm_autodown.MARKER_FILE
        wait_until(lambda: marker.is_file() and marker.stat().st_size > 0,
                   "the Slurm head's watcher to report", timeout=120, interval=0.5)

        started = time.monotonic()
        listed = run_invoke("list", "--json", "--timeout", str(TIMEOUT))
        took = time.monotonic() - started
        print(f"invoke list took {took:.1f}s with a {TIMEOUT}s timeout")
        assert listed.returncode == 0, listed.stderr
        assert "Traceback" not in listed.stderr
        assert took < TIMEOUT + 20, "a dead endpoint must not hold up the listing"
        rows = {r["cluster"]: r for r in json.loads(listed.stdout)["clusters"]}
        assert sorted(rows) == ["hpc", "lam", "loc", "tpus"]
        assert {r["provider"] for r in rows.values()} == {"local", "slurm", "lambda", "gcp-tpu"}

        down = rows["tpus"]
        assert down["reachable"] is False and down["state"] == "UNREACHABLE" and down["error"]
        assert "warning: gcp-tpu: could not ask for the current state" in listed.stderr
        assert [line for line in listed.stderr.splitlines() if "warning" in line] == [
            line for line in listed.stderr.splitlines() if "gcp-tpu" in line and "warning" in line]

        local = rows["loc"]
        assert local["reachable"] and local["state"] == "running"
        assert (local["nodes"], local["hourly_usd"], local["accrued_usd"]) == (1, 0.0, 0.0)
        assert local["autodown"] == "off" and local["uptime_s"] is not None

        lam = rows["lam"]
        assert lam["reachable"] is True, lam
        # The fake's price for gpu_1x_a10 (75 cents), one instance launched an hour ago.
        assert (lam["nodes"], lam["hourly_usd"]) == (1, 0.75)
        assert 0.74 < lam["accrued_usd"] < 0.80 and 3590 < lam["uptime_s"] < 3700
        assert lam["cost_source"].startswith("Lambda")
        assert lam["autodown_minutes"] == 60  # Lambda's default

        hpc = rows["hpc"]
        assert hpc["reachable"] is True, hpc
        assert hpc["state"] == "RUNNING" and hpc["nodes"] == 1
        assert hpc["hourly_usd"] is None and hpc["node_hours"] is not None
        assert hpc["autodown_minutes"] == 45
        # Enforced by the head's job: the watcher's countdown, read from its node.
        assert hpc["autodown"].startswith("45 min; autodown: idle"), hpc

        table = run_invoke("list", "--timeout", str(TIMEOUT), env={"COLUMNS": "250"})
        assert table.returncode == 0, table.stderr
        for name in ("loc", "lam", "hpc", "tpus"):
            assert name in table.stdout
        assert "UNREACHABLE" in table.stdout and "total now:" in table.stdout
    finally:
        with ThreadPoolExecutor(2) as pool:
            downs = list(pool.map(lambda name: run_invoke("teardown", "--cluster", name),
                                  ("loc", "hpc")))
        assert all(d.returncode == 0 for d in downs), [d.stderr for d in downs]

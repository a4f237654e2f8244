"""Fixtures for the Lambda provider: the fake API (scaled-down rate limits), a loopback sshd that
stands in for every instance, and spec files that point at both."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.lambda_cloud.fake_api import FakeLambda
from tests.lambda_cloud.sshd import LocalSshd

API_KEY = "secret_lambda_TESTKEY_5f0c1d2e3a4b"
#: Rate limits at 1/100: 10 ms between requests, 120 ms between launches.
SCALE = 0.01
CAPACITY = {("gpu_1x_a10", "us-east-1"): 6, ("gpu_1x_a10", "us-west-1"): 6,
            ("cpu_4x_general", "us-west-1"): 6}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLambda]:
    server = FakeLambda(API_KEY, scale=SCALE, boot_delay=0.3, terminate_delay=0.1, forget_delay=1.0,
                        capacity=dict(CAPACITY))
    # Someone else's instances in the same account, named to tempt a sloppy prefix match, and a
    # colleague's cluster made from the same spec name (exactly our old names, another SSH key,
    # no tag of ours), and the colleague's firewall ruleset.
    for name in ("prod-db", "lt-headless", "ltx-head", "lt-head-old", "lt-worker-1b",
                 "lt-head", "lt-worker-1"):
        server.add_foreign_instance(name)
    server.add_foreign_ruleset("rayfleet-lt-colleague", "us-east-1")
    with server.serving(monkeypatch):
        yield server


@pytest.fixture(scope="module")
def sshd(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSshd]:
    server = LocalSshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


SpecFactory = Callable[..., Path]


@pytest.fixture
def make_spec(rf_home: Path, tmp_path: Path, sshd: LocalSshd) -> SpecFactory:
    """Write `<tmp>/<name>.yaml` (default cluster `lt`) reaching the loopback sshd; authorize the
    cluster's key there (generated now, exactly as `up` would)."""
    from infra.core import ssh

    def make(name: str = "lt", **overrides: Any) -> Path:
        data: dict[str, Any] = {
            "provider": "lambda",
            "head": {"choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"},
                                 {"instance_type": "gpu_1x_a10", "region": "us-west-1"}]},
            "workers": {"count": 2, "choices": [
                {"instance_type": "gpu_1x_a10", "region": "us-east-1"},
                {"instance_type": "gpu_1x_a10", "region": "us-west-1"},
                {"instance_type": "cpu_4x_general", "region": "us-west-1"}]},
            "ssh_user": "root",
            "ssh_proxy_command": sshd.proxy_command,
            "env": "none",
            "boot_timeout_s": 30,
            "ray_timeout_s": 60,
        }
        data.update(overrides)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        sshd.authorize(ssh.ensure_keypair(name).public_key)
        return path

    return make


def read_state(home: Path, cluster: str = "lt") -> dict[str, Any] | None:
    """The state file as JSON (asserting it parses), or None if there is none."""
    path = home / "state" / f"{cluster}.json"
    if not path.exists():
        return None
    return dict(json.loads(path.read_text()))


def assert_clean(fake: FakeLambda, cluster: str = "lt", tagged: bool = True) -> None:
    """Nothing of ours costs money, every foreign instance and ruleset is exactly as it was, and
    no ruleset of ours is left."""
    inventory = fake.inventory()
    ours_running = [i for i in inventory if not i["foreign"] and i["status"] != "terminated"]
    assert ours_running == [], f"instances of ours still running: {ours_running}"
    foreign = [i for i in inventory if i["foreign"]]
    assert foreign and all(i["status"] == "active" for i in foreign), foreign
    for inst in inventory:
        if not inst["foreign"] and tagged:
            assert inst["tags"].get("rayfleet-cluster"), inst  # everything we launched is tagged
            assert inst["name"].startswith(f"{cluster}-{inst['tags']['rayfleet-cluster']}-"), inst
    rulesets = list(fake.firewall_rulesets.values())
    assert [r["name"] for r in rulesets if not r.get("foreign")] == [], rulesets


def ours(fake: FakeLambda, cluster: str = "lt") -> list[dict[str, Any]]:
    """Instances we launched (tagged with a cluster id) for `cluster`, terminated ones included."""
    return [i for i in fake.inventory()
            if not i["foreign"] and i["tags"].get("rayfleet-name") == cluster]

"""`sharing:` on gcp-tpu: a firewall rule of its own opens the gateway's port, to the head only,
from exactly `sharing.allowed_source_ranges`, beside (and independent of) the dashboard's; the
fake Compute API is held to Google's discovery document. (No GCP end-to-end run of the gateway:
the remote gateway's code is shared with Lambda's, which tests/lambda_cloud/test_e2e_sharing_isolation.py
runs.)"""

from __future__ import annotations

from pathlib import Path

from infra.core import state
from infra.node.gcp_tpu.api import ApiOptions
from infra.providers.gcp_tpu.records import Firewall
from tests.gcp_tpu.conftest import Dashboard, Sshd
from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.gcp_tpu.test_provider import Lab

GATEWAY = "rayfleet-lab-gateway"


def _sharing(ranges: list[str], port: int = 8443) -> dict[str, object]:
    return {"port": port, "allowed_source_ranges": ranges, "members_run_as_owner": True}


def test_the_gateway_rule_opens_its_port_to_the_head_from_the_allowed_ranges(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, sshd: Sshd,
        dashboard: Dashboard, key_file: Path) -> None:
    lab = Lab(tmp_path, fake, options, sshd, dashboard,
              sharing=_sharing(["198.51.100.0/24"]))
    planned = [r for r in lab.provider.plan(None).resources if r.name == GATEWAY]
    assert len(planned) == 1 and "tcp:8443 from 198.51.100.0/24 to the head only" in \
        planned[0].detail, planned
    lab.up()
    assert list(fake.firewalls) == [GATEWAY]  # no dashboard ranges: no dashboard rule
    rule = fake.firewalls[GATEWAY]
    assert rule["sourceRanges"] == ["198.51.100.0/24"] and rule["direction"] == "INGRESS"
    assert rule["targetTags"] == ["rayfleet-lab-head"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["8443"]}]
    # Another port and range: the same rule patched; `sharing:` removed: the rule goes.
    moved = Lab(tmp_path, fake, options, sshd, dashboard,
                sharing=_sharing(["203.0.113.0/24"], 9443))
    moved.up()
    assert list(fake.firewalls) == [GATEWAY]
    assert fake.firewalls[GATEWAY]["allowed"] == [{"IPProtocol": "tcp", "ports": ["9443"]}]
    assert fake.firewalls[GATEWAY]["sourceRanges"] == ["203.0.113.0/24"]
    closed = Lab(tmp_path, fake, options, sshd, dashboard)
    closed.up()
    assert fake.firewalls == {} and closed.state().resources(Firewall) == []
    closed.teardown()
    assert state.read("lab") is None


def test_teardown_removes_both_rules(tmp_path: Path, rf_home: Path, fake: FakeGcp,
                                     options: ApiOptions, sshd: Sshd, dashboard: Dashboard,
                                     key_file: Path) -> None:
    lab = Lab(tmp_path, fake, options, sshd, dashboard,
              dashboard={"port": dashboard.port, "allowed_source_ranges": ["10.8.0.0/16"]},
              sharing=_sharing(["10.9.0.0/16"]))
    lab.up()
    assert sorted(fake.firewalls) == ["rayfleet-lab-dashboard", GATEWAY]
    lab.teardown()
    assert fake.firewalls == {} and lab.left() == []

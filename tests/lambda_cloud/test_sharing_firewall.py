"""`sharing:` on Lambda: the cluster's ruleset opens the gateway's port, tcp only, to exactly
`allowed_source_ranges` (beside SSH from `ssh_source_ranges`), against the fake held to Lambda's
OpenAPI file; a change of either is applied at the next `up` and shown by `plan`."""

from __future__ import annotations

from pathlib import Path

from infra.core import state
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud import firewall
from tests.lambda_cloud.conftest import API_KEY, SCALE
from tests.lambda_cloud.fake_api import FakeLambda


def _opened(fake: FakeLambda, ruleset_id: str) -> set[tuple[str, tuple[int, ...], str]]:
    rules = fake.firewall_rulesets[ruleset_id]["rules"]
    return {(r["protocol"], tuple(r["port_range"]), r["source_network"]) for r in rules}


def test_the_ruleset_opens_the_gateway_port_to_the_allowed_ranges_only(
        fake: FakeLambda, rf_home: Path) -> None:
    client = api.LambdaClient(API_KEY, fake.url, api.Limits.scaled(SCALE))
    current = state.State.new(state.state_path("shr"), "shr", "lambda")
    ssh_from = ["203.0.113.0/24"]
    gateway = (8443, ["198.51.100.0/24", "192.0.2.7/32"])
    ruleset = firewall.ensure(client, current, "us-east-1", ssh_from, gateway)
    assert _opened(fake, ruleset) == {
        ("tcp", (22, 22), "203.0.113.0/24"),
        ("tcp", (8443, 8443), "198.51.100.0/24"), ("tcp", (8443, 8443), "192.0.2.7/32")}
    assert firewall.pending_change(current, ssh_from, gateway) is None

    moved = (9443, ["198.51.100.0/24"])
    change = firewall.pending_change(current, ssh_from, moved)
    assert change == ("sharing gateway: port 8443 from 198.51.100.0/24, 192.0.2.7/32 -> "
                      "port 9443 from 198.51.100.0/24"), change
    firewall.sync_recorded(client, current, ssh_from, moved)
    assert _opened(fake, ruleset) == {("tcp", (22, 22), "203.0.113.0/24"),
                                      ("tcp", (9443, 9443), "198.51.100.0/24")}
    # `sharing:` removed: the port closes again, SSH stays.
    assert firewall.pending_change(current, ssh_from, None) == \
        "sharing gateway: port 9443 from 198.51.100.0/24 -> closed"
    firewall.sync_recorded(client, current, ssh_from, None)
    assert _opened(fake, ruleset) == {("tcp", (22, 22), "203.0.113.0/24")}
    assert firewall.pending_change(current, ssh_from, None) is None

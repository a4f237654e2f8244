"""`up` of a shared cluster whose head came back on another address (Lambda: a new instance, a new
IP): one line naming exactly the members whose bundle names the old address."""

from __future__ import annotations

import pytest

from infra.core.sharing import owner as sharing


def test_up_names_the_members_whose_bundle_names_another_address(
        capfd: pytest.CaptureFixture[str]) -> None:
    new = "https://198.51.100.9:8443"
    members = {"alice": {"address": "https://198.51.100.4:8443"}, "bob": {"address": new},
               "carol": {}}  # added before entries recorded the address: the state's last one
    sharing.warn_stale_bundles(members, new, "https://198.51.100.4:8443")
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "members alice, carol need a new bundle" in err[0], err
    assert new in err[0]


def test_nothing_is_said_when_every_bundle_names_the_gateway(
        capfd: pytest.CaptureFixture[str]) -> None:
    url = "https://198.51.100.9:8443"
    sharing.warn_stale_bundles({"alice": {"address": url}, "bob": {}}, url, None)
    sharing.warn_stale_bundles({"bob": {}}, url, url)
    assert capfd.readouterr().err == ""

"""`up` of a shared cluster whose head came back on another address (Lambda: a new instance, a new
IP): one line naming exactly the members whose bundle names the old address."""

from __future__ import annotations

from infra.core.sharing import owner as sharing


def test_up_names_the_members_whose_bundle_names_another_address() -> None:
    new = "https://198.51.100.9:8443"
    members = {"alice": {"address": "https://198.51.100.4:8443"}, "bob": {"address": new},
               "carol": {}}  # added before entries recorded the address: the state's last one
    said = sharing.stale_bundles_warning(members, new, "https://198.51.100.4:8443")
    err = str(said).splitlines()
    assert len(err) == 1 and "members alice, carol need a new bundle" in err[0], err
    assert new in err[0]


def test_nothing_is_said_when_every_bundle_names_the_gateway() -> None:
    url = "https://198.51.100.9:8443"
    assert sharing.stale_bundles_warning({"alice": {"address": url}, "bob": {}}, url, None) is None
    assert sharing.stale_bundles_warning({"bob": {}}, url, url) is None

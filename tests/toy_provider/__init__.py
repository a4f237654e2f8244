"""A fifth provider, for the tests: everything a new provider brings, in its own package and
nothing else (ARCHITECTURE.md, "Adding a provider"). Its "cloud" is a folder on this machine, one
file per machine carrying the cluster's id, so `plan`, `up`, `status` and `teardown` run through
the CLI in the quick tier: it starts no Ray. `tests/test_toy_provider.py` registers it through the
public registry (`infra.providers.register`) and checks that shared code never names it."""

from __future__ import annotations

from infra.providers import Entry

#: The value of `provider:` in its specs.
NAME = "toy"
#: Its registry row: the only tie between the toy and rayfleet.
ENTRY = Entry("tests.toy_provider.spec:Spec", "tests.toy_provider.provider:Provider")

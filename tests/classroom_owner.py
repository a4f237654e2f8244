"""An owner's machine with a shared local cluster that `up` has recorded, and no cluster: the
state names a head and a gateway address, the cluster's CA exists. Enough for the member verbs,
which change only files here (for a head on this machine the gateway reads the registry from the
sharing folder directly), so the classroom tests run in a second without Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.core import state
from infra.core.sharing import certs as sharing_certs
from infra.core.sharing import owner as sharing
from infra.core.state import State
from infra.providers.local.records import Head

URL = "https://127.0.0.1:18443"


def owner_cluster(folder: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "",
                  name: str = "class", top: str = "") -> Path:
    """A spec `<folder>/<name>.yaml` with `sharing:` (plus `extra` lines under it), recorded as
    up in a RAYFLEET_HOME of its own; the spec's path. The working folder is `folder`. `top`:
    more top-level lines (a budget needs `autodown:`)."""
    monkeypatch.setenv("RAYFLEET_HOME", str(folder / "owner-home"))
    monkeypatch.chdir(folder)
    spec = folder / f"{name}.yaml"
    spec.write_text("provider: local\n" + top + "sharing:\n  port: 18443\n"
                    "  members_run_as_owner: true\n" + extra)
    current = State.new(state.state_path(name), name, "local")
    current.add("head", Head(port_base=26000))
    current.set_info(gateway_url=URL)
    current.save()
    sharing_certs.ensure_ca(name)
    return spec


def book(cluster: str = "class") -> dict:
    from infra.core.sharing import term as sharing_term

    return sharing_term.read_book(cluster)


def registry(cluster: str = "class") -> Path:
    return sharing.registry_path(cluster)

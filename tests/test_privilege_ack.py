"""Issue 29's acknowledgement: where rayfleet cannot give Ray a user of its own (local and slurm: the
owner's account), a spec with `sharing:` must say
`sharing.members_run_as_owner: true`; without it `plan` and `up` refuse in one line that says why,
and with it every `up` warns in one line (on the shared cluster of tests/local/test_e2e_sharing.py,
whose spec says it)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from infra.node import rayproc
from tests.conftest import ROOT
from tests.forked_cli import run_invoke

SLURM = (ROOT / "clusters" / "slurm.yaml").read_text()


def _spec(folder: Path, body: str) -> Path:
    path = folder / f"ack-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("verb", ["plan", "up"])
@pytest.mark.parametrize("base", ["provider: local\nnum_cpus: 1\n", SLURM])
def test_sharing_without_the_acknowledgement_is_refused(tmp_path: Path, verb: str, base: str) -> None:
    spec = _spec(tmp_path, base + "\nsharing:\n  port: 28999\n")
    home = tmp_path / "home"
    done = run_invoke(verb, "--cluster", str(spec), env={"RAYFLEET_HOME": str(home)})
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "sharing.members_run_as_owner" in lines[0] and "run as your own account" in lines[0]
    # Nothing created: no state, no keys, no gateway.
    assert not (home / "state").exists() or not any((home / "state").glob("*.json"))
    assert not (home / "keys").exists()


def test_with_the_acknowledgement_plan_passes(tmp_path: Path) -> None:
    """The acknowledged spec plans (nothing started); that every `up` of it then warns in one line
    is checked on the shared local cluster's own `up`s (tests/local/test_e2e_sharing.py), which
    carry the same acknowledgement, rather than on a cluster of this test's own."""
    spec = _spec(tmp_path, "provider: local\nnum_cpus: 1\nobject_store_memory_mb: 100\n"
                           f"sharing:\n  port: {rayproc.free_port()}\n  members_run_as_owner: true\n")
    planned = run_invoke("plan", "--cluster", str(spec), env={"RAYFLEET_HOME": str(tmp_path / "home")})
    assert planned.returncode == 0, planned.stderr

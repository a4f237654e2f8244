"""Issue 29's acknowledgement: where rayfleet cannot give Ray a user of its own (local and slurm: the
owner's account), a spec with `sharing:` must say
`sharing.members_run_as_owner: true`; without it `plan` and `up` refuse in one line that says why,
and with it every `up` warns in one line."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from infra.node import rayproc
from tests.conftest import ROOT, run_invoke

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


@pytest.mark.slow
def test_with_the_acknowledgement_every_up_warns_in_one_line(tmp_path: Path) -> None:
    port = rayproc.free_port()
    spec = _spec(tmp_path, "provider: local\nnum_cpus: 1\nobject_store_memory_mb: 100\n"
                           f"sharing:\n  port: {port}\n  members_run_as_owner: true\n")
    env = {"RAYFLEET_HOME": str(tmp_path / "home")}
    planned = run_invoke("plan", "--cluster", str(spec), env=env)
    assert planned.returncode == 0, planned.stderr
    try:
        for _ in range(2):  # the first `up` and the next one, on the running cluster
            up = run_invoke("up", "--cluster", str(spec), env=env)
            assert up.returncode == 0, up.stdout + up.stderr
            warnings = [line for line in up.stderr.splitlines() if "members_run_as_owner" in line]
            assert len(warnings) == 1 and "run as your own account" in warnings[0], up.stderr
            assert rayproc.port_answers("127.0.0.1", port)
    finally:
        down = run_invoke("teardown", "--cluster", str(spec), env=env)
        assert down.returncode == 0, down.stderr
    assert not rayproc.port_answers("127.0.0.1", port)

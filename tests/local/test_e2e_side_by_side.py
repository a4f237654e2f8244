"""Two local clusters of one name on one machine (two checkouts), driven by `rayfleet` from a
user's own project.

Each cluster's jobs reach their own cluster, Ray's tools inside jobs included (every node's Ray
knows its cluster's address); the project, not rayfleet's checkout, is uploaded, without what its
.gitignore ignores; the private temp dirs are gone after teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from infra.node import rayproc
from tests.conftest import ROOT
from tests.local.cluster_info import dashboard_client
from tests.local.temp_dirs import temp_dir_pattern

pytestmark = pytest.mark.slow


def rayfleet(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """The installed `rayfleet` command (the venv's console script), run as a user would."""
    command = Path(sys.executable).with_name("rayfleet")
    return subprocess.run([str(command), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "RAYFLEET_HOME": str(home)}, timeout=300, check=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A researcher's own git repository, outside rayfleet's checkout, with ignored files."""
    root = tmp_path / "my-project"
    (root / "jobs").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "state_api_job.py", root / "jobs" / "state_api_job.py")
    (root / "helper.py").write_text("VALUE = 1\n")
    (root / ".gitignore").write_text("data/\n*.ckpt\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"0" * 1024)
    (root / "model.ckpt").write_text("weights")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    # Ignored through git's own per-repository file, which Ray's upload does not read.
    (root / ".git" / "info" / "exclude").write_text("notes.txt\n")
    (root / "notes.txt").write_text("private notes")
    return root


@pytest.fixture
def twins(tmp_path: Path) -> Iterator[tuple[Path, list[Path]]]:
    """One spec, and two RAYFLEET_HOMEs (two clones, or CI beside a developer) that each bring up
    a cluster of that one name."""
    spec = tmp_path / f"t{uuid.uuid4().hex[:8]}.yaml"
    spec.write_text("provider: local\nnum_cpus: 1\nobject_store_memory_mb: 100\n")
    homes = [tmp_path / "checkout-a", tmp_path / "checkout-b"]
    yield spec, homes
    for home in homes:
        rayfleet("teardown", "--cluster", str(spec), cwd=tmp_path, home=home)
    leftovers = rayproc.cluster_processes([temp_dir_pattern(spec.stem)])
    rayproc.terminate(leftovers)
    assert not leftovers, f"test left processes behind: {leftovers}"


def _submit(spec: Path, project: Path, home: Path, args: list[str]) -> None:
    """The project's job on the cluster of `home`: it succeeds there, on that cluster's one node,
    with the project's files."""
    done = rayfleet("submit", "--cluster", str(spec), "jobs/state_api_job.py", *args, cwd=project,
                    home=home)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output and "multiple active Ray instances" not in output
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["nodes"] == 1
    # The project's git root was uploaded, without what git ignores.
    assert set(result["files"]) == {".gitignore", "helper.py", "jobs/state_api_job.py"}


def _entrypoints(spec: Path, home: Path) -> list[str]:
    """The entrypoints of the jobs Ray's job API lists on the cluster of `home` (read over HTTP
    with its own dashboard address and token: a `rayfleet status` is 1-2 s of CPU)."""
    url, headers = dashboard_client(home, spec.stem)
    answer = requests.get(f"{url}/api/jobs/", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text[:300]
    return [job["entrypoint"] for job in answer.json()]


def test_two_checkouts_run_same_named_clusters_side_by_side_for_a_users_project(
        twins: tuple[Path, list[Path]], project: Path) -> None:
    """Each cluster's jobs reach their own cluster; each teardown stops only its own Ray, and the
    other keeps running jobs."""
    spec, homes = twins
    temp_dirs = []
    for home in homes:
        # By path, from the project's folder: no tasks.py there.
        up = rayfleet("up", "--cluster", str(spec), cwd=project, home=home)
        assert up.returncode == 0, up.stderr
        state = json.loads((home / "state" / f"{spec.stem}.json").read_text())
        head = state["resources"][0]
        temp_dirs.append(Path(head["id"]))
        parent = Path(head["attrs"]["temp_parent"])
        assert Path(head["id"]).parent == parent and parent.name.startswith("rf-")
        assert stat.S_IMODE(parent.stat().st_mode) == 0o700
        assert not str(parent).startswith(str(ROOT))
    assert temp_dirs[0] != temp_dirs[1]
    b_pids = rayproc.cluster_processes([str(temp_dirs[1])])
    assert b_pids

    # Arguments the job ignores, long enough that a cut entrypoint would show.
    args = ["--", *(f"--unused-argument-{i}" for i in range(6))]
    entrypoint = "python jobs/state_api_job.py " + " ".join(args[1:])
    for home in homes:
        _submit(spec, project, home, args)
        assert _entrypoints(spec, home) == [entrypoint]

    for follow in ([], ["--follow"]):
        bogus = rayfleet("logs", "raysubmit_bogus", *follow, "--cluster", str(spec), cwd=project,
                         home=homes[0])
        assert bogus.returncode != 0 and "Traceback" not in bogus.stderr
        assert bogus.stderr.strip() == (f"error: job raysubmit_bogus: no such job on this cluster; "
                                        f"`invoke status --cluster={spec}` lists its jobs")

    down = rayfleet("teardown", "--cluster", str(spec), cwd=project, home=homes[0])
    assert down.returncode == 0, down.stderr
    assert not temp_dirs[0].parent.exists()
    assert rayproc.cluster_processes([str(temp_dirs[0])]) == []
    assert set(b_pids) <= set(rayproc.cluster_processes([str(temp_dirs[1])]))
    _submit(spec, project, homes[1], args)
    assert _entrypoints(spec, homes[1]) == [entrypoint, entrypoint]

    down = rayfleet("teardown", "--cluster", str(spec), cwd=project, home=homes[1])
    assert down.returncode == 0, down.stderr
    assert not temp_dirs[1].parent.exists()
    assert rayproc.cluster_processes([temp_dir_pattern(spec.stem)]) == []

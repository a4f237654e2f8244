"""Two local clusters on one machine, driven by `rayfleet` from a user's own project.

Each cluster's jobs reach their own cluster, Ray's tools inside jobs included (every node's Ray
knows its cluster's address); the project, not rayfleet's checkout, is uploaded, without what its
.gitignore ignores; the private temp dirs are gone after teardown.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.node import rayproc
from tests.conftest import ROOT
from tests.local.temp_dirs import temp_dir_pattern

pytestmark = pytest.mark.slow


def rayfleet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed `rayfleet` command (the venv's console script), run as a user would."""
    command = Path(sys.executable).with_name("rayfleet")
    return subprocess.run([str(command), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


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
def two_specs(tmp_path: Path, rf_home: Path) -> Iterator[list[Path]]:
    specs = []
    for _ in range(2):
        path = tmp_path / f"s{uuid.uuid4().hex[:8]}.yaml"
        path.write_text("provider: local\nnum_cpus: 1\nobject_store_memory_mb: 100\n")
        specs.append(path)
    yield specs
    for path in specs:
        rayfleet("teardown", "--cluster", str(path), cwd=tmp_path)
        leftovers = rayproc.cluster_processes([temp_dir_pattern(path.stem)])
        rayproc.terminate(leftovers)
        assert not leftovers, f"test left processes behind: {leftovers}"


def test_two_clusters_side_by_side_run_jobs_of_a_users_project(
        two_specs: list[Path], project: Path, rf_home: Path) -> None:
    temp_dirs = []
    for spec in two_specs:
        # By path, from the project's folder: no tasks.py there.
        up = rayfleet("up", "--cluster", str(spec), cwd=project)
        assert up.returncode == 0, up.stderr
        state = json.loads((rf_home / "state" / f"{spec.stem}.json").read_text())
        head = state["resources"][0]
        temp_dirs.append(Path(head["id"]))
        parent = Path(head["attrs"]["temp_parent"])
        assert Path(head["id"]).parent == parent and parent.name.startswith("rf-")
        assert stat.S_IMODE(parent.stat().st_mode) == 0o700
        assert not str(parent).startswith(str(ROOT))

    # Arguments the job ignores, long enough that a cut entrypoint would show.
    args = ["--", *(f"--unused-argument-{i}" for i in range(6))]
    for spec in two_specs:
        done = rayfleet("submit", "--cluster", str(spec), "jobs/state_api_job.py", *args, cwd=project)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert "Traceback" not in output and "multiple active Ray instances" not in output
        result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
        assert result["nodes"] == 1
        # The project's git root was uploaded, without what git ignores.
        assert set(result["files"]) == {".gitignore", "helper.py", "jobs/state_api_job.py"}
        status = rayfleet("status", "--cluster", str(spec), "--json", cwd=project)
        assert status.returncode == 0, status.stderr
        assert [job["entrypoint"] for job in json.loads(status.stdout)["jobs"]] == [
            "python jobs/state_api_job.py " + " ".join(args[1:])]

    for follow in ([], ["--follow"]):
        bogus = rayfleet("logs", "raysubmit_bogus", *follow, "--cluster", str(two_specs[0]),
                         cwd=project)
        assert bogus.returncode != 0 and "Traceback" not in bogus.stderr
        assert bogus.stderr.strip() == (f"error: job raysubmit_bogus: no such job on this cluster; "
                                        f"`invoke status --cluster={two_specs[0]}` lists its jobs")

    for spec, temp_dir in zip(two_specs, temp_dirs, strict=True):
        down = rayfleet("teardown", "--cluster", str(spec), cwd=project)
        assert down.returncode == 0, down.stderr
        assert not temp_dir.parent.exists()

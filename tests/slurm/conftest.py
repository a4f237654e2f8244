"""Helpers for the Slurm provider tests: specs pointing at the test bed's real Slurm, and checks."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_invoke
from tests.testbed.hosts import ray_bin_dir
from tests.testbed.slurm import LocalSlurm, SlurmCluster

#: Registers a spec for teardown after the test (see `torn_down`); returns it.
Register = Callable[[Path], Path]
#: Every node sees the whole machine: keep each Ray small.
SMALL = "cpus_per_node: 1\nobject_store_memory_mb: 100\nready_timeout_s: 120\n"


def _small(extra: str) -> str:
    """SMALL, with `metrics: none` unless `extra` names metrics: the cluster's Prometheus is
    tested in test_e2e_autoscale.py; elsewhere it would only take the 2-core bed's CPU. A head's
    `cpus_per_node` in `extra` stands instead of SMALL's."""
    small = SMALL.replace("cpus_per_node: 1\n", "") if re.search(r"^cpus_per_node:", extra,
                                                                  re.MULTILINE) else SMALL
    return small + ("" if "metrics" in extra else "metrics: none\n") + extra


def local_spec(tmp_path: Path, slurm: LocalSlurm, name: str, extra: str = "") -> Path:
    """A spec that submits to the single-node Slurm on this machine."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"provider: slurm\nsubmit:\n  slurm_conf: {slurm.conf_path}\n"
                    f"  workdir: {slurm.jobs_dir}\n{_small(extra)}")
    return path


def login_spec(tmp_path: Path, slurm: SlurmCluster, name: str, extra: str = "") -> Path:
    """A spec that submits through the 2-node cluster's login host over SSH."""
    login = slurm.login_host
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"provider: slurm\nsubmit:\n  host: {login.ip}\n  user: {login.ssh_user}\n"
        f"  key: {login.ssh_key_path}\n  proxy_command: {slurm.testbed.proxy_command}\n"
        f"  known_hosts: {slurm.testbed.known_hosts_path}\n"
        f"  workdir: {slurm.jobs_dir}\n{_small(extra)}")
    return path


def invoke(*args: str, timeout: float = 300,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`invoke ARGS` with the tests' Ray first on PATH (jobs inherit the submitter's PATH)."""
    import os

    path = f"{ray_bin_dir()}:{os.environ.get('PATH', '')}"
    return run_invoke(*args, env={"PATH": path, **(env or {})}, timeout=timeout)


def submit_script(folder: Path, spec: Path, name: str, text: str, *args: str,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`invoke submit` of a script `text` written to `folder`, from there (the working dir the
    job uploads), as a user whose project is elsewhere runs it."""
    import os

    from tests.conftest import ROOT

    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    path = f"{ray_bin_dir()}:{os.environ.get('PATH', '')}"
    return run_invoke("-r", str(ROOT), "submit", "--cluster", str(spec), name, *args, cwd=folder,
                      env={"PATH": path, **(env or {})}, timeout=300)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def job_of(home: Path, name: str) -> dict[str, Any]:
    """The Slurm job recorded in the cluster's state file."""
    state = json.loads((home / "state" / f"{name}.json").read_text())
    jobs = [r for r in state["resources"] if r["kind"] == "slurm-job"]
    assert len(jobs) == 1, state
    return {"name": jobs[0]["id"], "cluster_id": state["cluster_id"], **jobs[0]["attrs"]}


def temp_marker(job: dict[str, Any], root: str = "/tmp") -> str:
    """What every private temp dir of the cluster's nodes starts with (mktemp adds the rest)."""
    return f"{root}/rf-{job['cluster_id']}."


def result_of(stdout: str) -> dict[str, Any]:
    """The RESULT line of examples/cpu_example.py."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, stdout
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


def state_empty(home: Path, name: str) -> bool:
    return not (home / "state" / f"{name}.json").exists()


@dataclass
class LoginCluster:
    """One cluster on the 2-host bed, submitted through its login host, with its own
    RAYFLEET_HOME (a module's shared cluster; the cluster's name is the spec's stem)."""

    spec: Path
    home: Path
    slurm: SlurmCluster

    def invoke(self, verb: str, *args: str, timeout: float = 300) -> Any:
        return invoke(verb, "--cluster", str(self.spec), *args, timeout=timeout,
                      env={"RAYFLEET_HOME": str(self.home)})

    @property
    def job(self) -> dict[str, Any]:
        return job_of(self.home, self.spec.stem)

    def status(self) -> dict[str, Any]:
        return dict(json.loads(ok(self.invoke("status", "--json"))))

    def alive_nodes(self) -> int:
        """Alive nodes as Ray's state API lists them (`invoke status --json`)."""
        return sum(1 for n in self.status()["nodes"] if n["state"] == "ALIVE")


@pytest.fixture
def torn_down(rf_home: Path) -> Iterator[Register]:
    """Register a spec whose cluster must be gone after the test, even when the test failed.

    Without it a failing test would leave its job running until the test bed is killed, and the
    job's temp dirs (on the machine's shared /tmp) behind.
    """
    specs: list[Path] = []

    def register(spec: Path) -> Path:
        specs.append(spec)
        return spec

    yield register
    for spec in specs:
        if (rf_home / "state" / f"{spec.stem}.json").exists():
            invoke("teardown", "--cluster", str(spec))


def ray_left_on_hosts(slurm: SlurmCluster, job: dict[str, Any]) -> dict[str, str]:
    """Processes naming the cluster's temp dirs, per host, as each host itself sees them."""
    left = {}
    for host in slurm.nodes:
        marker = temp_marker(job).replace(".", "[.]")
        out = host.run(f"pgrep -af '{marker}' || true", check=True).stdout.strip()
        if out:
            left[host.name] = out
    return left

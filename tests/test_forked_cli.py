"""tests/forked_cli.py answers as a fresh process does: the same exit code, stdout and stderr, with
the run's own arguments, environment, working directory and stdin, and a timeout that ends it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked_cli
from tests.conftest import ROOT, run_invoke, run_rayfleet


def _fresh(module: str, input: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module], cwd=ROOT, capture_output=True,
                          text=True, input=input, env=dict(os.environ), check=False)


def _same(fresh: subprocess.CompletedProcess[str], forked: subprocess.CompletedProcess[str]) -> None:
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.args == fresh.args


def test_a_refused_spec_and_a_foreign_bundle_answer_as_a_fresh_process(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("provider: local\nsharing:\n  members_run_as_owner: true\n  port: 80\n")
    home = {"RAYFLEET_HOME": str(tmp_path / "h")}
    refused = forked_cli.run_invoke("plan", "--cluster", str(spec), env=home)
    _same(run_invoke("plan", "--cluster", str(spec), env=home), refused)
    assert refused.returncode == 2 and "sharing.port" in refused.stderr
    bundle = tmp_path / "b.json"
    bundle.write_text("{not json")
    _same(run_invoke("join", str(bundle), env=home), forked_cli.run_invoke("join", str(bundle), env=home))


def test_the_run_has_its_own_directory_environment_and_input(tmp_path: Path) -> None:
    # A relative spec path is found only in the run's directory; the plan lands in its RAYFLEET_HOME.
    (tmp_path / "mine.yaml").write_text("provider: local\nnum_cpus: 1\n")
    home = tmp_path / "home"
    planned = forked_cli.run_rayfleet("plan", "--cluster", "mine.yaml", cwd=tmp_path,
                                      env={"RAYFLEET_HOME": str(home)})
    assert planned.returncode == 0, planned.stderr
    assert str(home) in planned.stdout + planned.stderr and home.is_dir()
    elsewhere = forked_cli.run_rayfleet("plan", "--cluster", "mine.yaml", cwd=ROOT,
                                        env={"RAYFLEET_HOME": str(home)})
    assert elsewhere.returncode != 0
    # stdin, and an exit through SystemExit with a message, as `python -m json.tool` makes it.
    for given in ('{"a": [1, 2]}', "{broken"):
        _same(_fresh("json.tool", input=given), forked_cli.run_module("json.tool", input=given))


def test_rayfleet_help_from_another_directory(tmp_path: Path) -> None:
    _same(run_rayfleet("--help", cwd=tmp_path), forked_cli.run_rayfleet("--help", cwd=tmp_path))


def test_a_run_past_its_timeout_is_ended_and_the_next_one_runs() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli.run_module("code", input="import time\ntime.sleep(120)\n", timeout=1)
    done = forked_cli.run_module("json.tool", input="[1]")
    assert (done.returncode, done.stdout) == (0, "[\n    1\n]\n")

"""setup/users/ray.sh, every cloud node's `ray start` and `ray stop`: which Ray CLI it runs (raycli
through the Python the `ray` script names, only where proven; else Ray's own `ray`, said in one
line), the words it runs before Ray, and the variables it passes on to Ray's user."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from infra.core import privilege
from infra.node import raycli
from tests.node.fake_ray import fake_ray

SCRIPT = Path(privilege.SCRIPTS_SOURCE) / "ray.sh"


def _ray(bin_dir: Path, first_line: str, body: str = "") -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "ray"
    path.write_text(f"{first_line}\n{body}")
    path.chmod(0o755)
    return path


def _run(bin_dir: Path, pythonpath: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    """ray.sh as the caller (`-u -`: no switch of user), with only `bin_dir` and the system's
    folders on PATH."""
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(bin_dir.parent),
           **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    return subprocess.run(["bash", str(SCRIPT), "-u", "-", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd="/")


def test_a_ray_script_that_names_a_python_is_run_through_raycli_by_that_python(
        tmp_path: Path) -> None:
    """A `ray` with no python beside it (`pip --user`, a system install): the Python its first
    line names runs raycli, which skips the groups for the proven Ray, without a note."""
    root = fake_ray(tmp_path / "site", raycli.PROVEN)
    bin_dir = tmp_path / "user" / "bin"
    _ray(bin_dir, f"#!{sys.executable}", "raise SystemExit('the script itself ran')\n")
    run = _run(bin_dir, root, "-e", 'RF_PROBE="$HOME/token" ', "start", "--head", "--port=1")
    assert run.returncode == 0, run.stderr
    name, groups, python, probe, *args = run.stdout.split()
    assert (name, groups, python) == ("ray", "0", sys.executable)
    # The words ran in the home of the user that runs Ray (its $HOME), before Ray.
    assert probe == f"{tmp_path / 'user'}/token"
    assert args == ["start", "--head", "--port=1"]
    assert run.stderr == ""


def test_another_ray_version_gets_rays_own_cli_and_a_note(tmp_path: Path) -> None:
    root = fake_ray(tmp_path / "site", "2.9.3")
    bin_dir = tmp_path / "env" / "bin"
    _ray(bin_dir, f"#!/usr/bin/env {Path(sys.executable).name}")
    (bin_dir / Path(sys.executable).name).symlink_to(sys.executable)
    run = _run(bin_dir, root, "start", "--address=10.0.0.1:6379")
    assert run.returncode == 0, run.stderr
    name, groups, _, _, *args = run.stdout.split()
    assert (name, groups, args) == ("ray", "3", ["start", "--address=10.0.0.1:6379"])
    assert run.stderr.splitlines() == [
        f"rayfleet: plain ray: Ray 2.9.3 here, raycli is proven with {raycli.PROVEN}"]


def test_a_ray_that_names_no_python_runs_itself_and_says_so(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    ray = _ray(bin_dir, "#!/bin/bash", 'echo "own ray: $*"\n')
    run = _run(bin_dir, None, "start", "--head")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "own ray: start --head\n"
    assert run.stderr.splitlines() == [
        f"rayfleet: plain ray: the first line of {ray} names no Python to run raycli with"]


def test_no_ray_on_path_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    run = _run(tmp_path / "bin", None, "start", "--head")
    assert run.returncode == 127
    assert run.stderr.startswith("ray.sh: no ray on PATH"), run.stderr
    bad = _run(tmp_path / "bin", None, "launch")
    assert bad.returncode == 2
    assert "unknown command 'launch': expected start, stop or sh" in bad.stderr


def test_stop_is_quiet_and_never_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _ray(bin_dir, "#!/bin/bash", 'echo "stopping $*"; exit 3\n')
    run = _run(bin_dir, None, "stop")
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


def test_the_script_carries_raycli_and_passes_on_what_privilege_says() -> None:
    text = SCRIPT.read_text()
    program = re.search(r"<<'PY'[^\n]*\n(.*?)\nPY\n", text, re.S)
    assert program is not None
    assert program.group(1) == raycli.RUN.rstrip("\n")
    passed = re.search(r'readonly PASSED_ON="([^"]*)"', text)
    assert passed is not None
    assert tuple(passed.group(1).split()) == privilege.PASSED_ON


def test_the_script_switches_to_rays_user_with_path_and_the_passed_on_variables(
        tmp_path: Path) -> None:
    """The switch itself, with `runuser` and `sudo` standing in (they print what they were
    given): PATH and only the set PASSED_ON variables reach Ray's user's shell."""
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "runuser").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$RF_OUT"\n')
    (fakes / "runuser").chmod(0o755)
    (fakes / "sudo").write_text('#!/bin/bash\n[ "$1" = -n ] && shift; exec "$@"\n')
    (fakes / "sudo").chmod(0o755)
    out = tmp_path / "argv"
    env = {**os.environ, "PATH": f"{fakes}:/usr/bin:/bin", "RF_OUT": str(out),
           "RAY_HEAD_IP": "10.0.0.9"}
    env.pop("RAY_OVERRIDE_RESOURCES", None)
    run = subprocess.run(["bash", str(SCRIPT), "start", "--head"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    argv = out.read_text().splitlines()
    assert argv[:4] == ["-u", privilege.RAY_USER, "--", "env"]
    assert f"PATH={fakes}:/usr/bin:/bin" in argv and "RAY_HEAD_IP=10.0.0.9" in argv
    assert not any(a.startswith("RAY_OVERRIDE_RESOURCES=") for a in argv)

"""setup/users/ray.sh, every cloud node's `ray start` and `ray stop`: which Ray CLI it runs (raycli
through the Python the `ray` script names, only where proven; else Ray's own `ray`, said in one
line), the words it runs before Ray, and the variables it passes on to Ray's user; and
setup/users/node.sh, the node's start, as the cluster's node.conf says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.core import node_start, privilege
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


NODE_SCRIPT = SCRIPT.with_name("node.sh")


def _node_bed(tmp_path: Path, running: bool = False) -> tuple[Path, dict[str, str]]:
    """A home with setup/users/ (users.sh, guard.sh, gcp_tpu_env.sh recording their arguments),
    stubs of sudo, runuser and pgrep (Ray's user runs something: `running`), and a `ray` that
    records its pid, arguments and the RF_ variables it got."""
    home, stubs, log = tmp_path / "home", tmp_path / "stubs", tmp_path / "calls.log"
    users = home / privilege.USERS_DIR
    users.mkdir(parents=True)
    (home / ".rayfleet").mkdir()
    for name in ("node.sh", "ray.sh"):
        (users / name).write_text((SCRIPT.parent / name).read_text())
    for name in ("users.sh", "guard.sh"):
        (users / name).write_text(f'echo "{name} $*" >> "{log}"\n')
    (users / "gcp_tpu_env.sh").write_text("echo export RF_TPU=v9\n")
    stubs.mkdir()
    scripts = {"sudo": 'while [ "${1#-}" != "$1" ]; do shift; done; exec "$@"',
               "runuser": 'while [ "$1" != -- ]; do shift; done; shift; exec "$@"',
               "pgrep": f"exit {0 if running else 1}",
               "ray": f'echo "ray $$ $* | RF_WORD=${{RF_WORD:-}} RF_TPU=${{RF_TPU:-}}" >> "{log}"'}
    for name, body in scripts.items():
        (stubs / name).write_text(f"#!/bin/bash\n{body}\n")
        (stubs / name).chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(home), "RAY_HEAD_IP": "10.0.0.9"}
    return users, env


def _conf(users: Path, **options: Any) -> None:
    roles = {"head": node_start.Role("the head", ["ray:.rayfleet/ray-token", "scaler:key"],
                                     'RF_WORD="$HOME/h" ', "--head --port=6379",
                                     moved=["key"]),
             "worker": node_start.Role("a worker", ["ray:.rayfleet/ray-token"],
                                       ". ./.rayfleet/tpu-env && RF_WORD=w",
                                       "--address=$RAY_HEAD_IP:6379 --disable-usage-stats")}
    (users / "node.conf").write_text(node_start.conf("c", "a test", roles, **options))


def test_node_sh_starts_each_role_as_its_node_conf_says_in_its_own_process(
        tmp_path: Path) -> None:
    users, env = _node_bed(tmp_path)
    _conf(users, guard=["169.254.169.254"], tpu_env=".rayfleet/tpu-env")
    home, log = users.parent.parent, tmp_path / "calls.log"
    (home / "key").write_text("k")
    for role in ("head", "worker"):
        log.write_text("")
        started = subprocess.Popen(["bash", str(users / "node.sh"), role], env=env, cwd="/",
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, err = started.communicate(timeout=60)
        assert started.returncode == 0, err
        calls = log.read_text().splitlines()
        # The users first (their files from the SSH user's home), then the guard, then Ray.
        assert calls[0] == f"users.sh {home} " + (
            "ray:.rayfleet/ray-token scaler:key" if role == "head" else "ray:.rayfleet/ray-token")
        assert calls[1] == "guard.sh 169.254.169.254"
        ray = calls[2].split()
        # Ray runs in node.sh's own process: ray.sh is read into it, then exec'd through to Ray.
        assert ray[1] == str(started.pid)
        if role == "head":
            assert ray[2:] == ["start", "--head", "--port=6379", "|", f"RF_WORD={home}/h",
                               "RF_TPU="]
            assert not (home / "key").exists()  # moved: the user's copy is the only one
        else:
            # Ray's TPU attributes, read as root into Ray's user's home, then Ray's own words.
            assert ray[2:] == ["start", "--address=10.0.0.9:6379", "--disable-usage-stats", "|",
                               "RF_WORD=w", "RF_TPU=v9"]
        assert len(calls) == 3, calls  # no `ray stop`: Ray's user runs nothing


def test_node_sh_stops_a_running_ray_first_and_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    users, env = _node_bed(tmp_path, running=True)
    _conf(users, tpu_env=".rayfleet/tpu-env")
    run = subprocess.run(["bash", str(users / "node.sh"), "worker"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["users.sh", "ray", "ray"]
    assert calls[1].split()[2:] == ["stop", "|", "RF_WORD=", "RF_TPU="]
    bad = subprocess.run(["bash", str(users / "node.sh"), "launch"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert (bad.returncode, bad.stderr) == (2, "node.sh: expected head or worker, got 'launch'\n")
    (users / "node.conf").unlink()
    none = subprocess.run(["bash", str(users / "node.sh"), "head"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert none.returncode == 2 and none.stderr.startswith("node.sh: no ") \
        and "node.conf (rendered by up)" in none.stderr, none.stderr


def test_a_start_line_is_a_few_words() -> None:
    assert node_start.command("worker") == "bash ~/rayfleet/users/node.sh worker"
    assert node_start.command("head", "~/rayfleet/worker") == \
        "bash ~/rayfleet/worker/rayfleet/users/node.sh head"
    with pytest.raises(ValueError, match="head or worker"):
        node_start.command("head; rm -rf ~")

"""Ray's CLI as every node's `ray start` loads it (infra/node/raycli.py): Ray's own commands, without
the optional command groups, which stay importable afterwards."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.node import raycli
from tests.conftest import STARTS_RAY
from tests.node.fake_ray import fake_ray

PROBE = """
import json
loaded = sorted(m for m in sys.modules if m.split(".")[:2] in (["ray", "serve"], ["pandas"])
                or m.startswith(("ray.util.state.state_cli", "ray.dashboard.modules.job.cli")))
cli = sys.modules["ray.scripts.scripts"].cli
import ray.util.state.state_cli  # the marks are gone: a later import works as usual
print(json.dumps({"loaded": loaded, "commands": sorted(cli.commands), "main": main.__module__}))
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def test_the_import_skips_only_the_optional_groups_and_leaves_them_importable() -> None:
    run = _python(raycli.IMPORT + "\n" + PROBE)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["loaded"] == [], "Serve's, the job and the state CLI were imported"
    assert found["main"] == "ray.scripts.scripts"
    # Ray's own commands, `start` among them; only the three optional groups are missing.
    assert {"start", "stop", "status"} <= set(found["commands"])
    assert not {"serve", "job", "list"} & set(found["commands"])


def test_the_groups_are_the_ones_rays_cli_imports_only_if_it_can() -> None:
    """Each skipped module is imported by Ray's scripts.py inside a try whose handler catches
    the ImportError a missing module raises: after a Ray upgrade moves one, this says so."""
    spec = importlib.util.find_spec("ray.scripts.scripts")
    assert spec is not None and spec.origin
    tree = ast.parse(Path(spec.origin).read_text())
    optional = {node.module for block in ast.walk(tree) if isinstance(block, ast.Try)
                for node in block.body if isinstance(node, ast.ImportFrom)
                if any(isinstance(h.type, ast.Name) and h.type.id in ("Exception", "ImportError")
                       for h in block.handlers)}
    assert set(raycli.OPTIONAL_GROUPS) <= optional, optional


def test_ray_start_help_runs_in_process_and_in_a_node_shell(tmp_path: Path) -> None:
    direct = _python(raycli.RUN, "start", "--help")
    assert direct.returncode == 0, direct.stderr
    assert "Usage: ray start" in direct.stdout and "--address" in direct.stdout
    # As a node's command line has it: the Python beside the `ray` on PATH.
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "ray").exists()
    shell = subprocess.run(["bash", "-c", f"{raycli.RAY} start --help"], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path,
                           env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert shell.returncode == 0, shell.stderr
    assert "Usage: ray start" in shell.stdout
    assert STARTS_RAY in raycli.RAY and STARTS_RAY in raycli.RUN


def test_main_is_rays_entry_point() -> None:
    run = _python("from infra.node import raycli; import sys; entry = raycli.main(); "
                  "print(entry.__module__, entry.__name__, 'ray.serve' in sys.modules)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ray.scripts.scripts", "main", "False"]


def _ray_script(path: Path, first_line: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{first_line}\nimport sys\nfrom ray.scripts.scripts import main\n")
    path.chmod(0o755)
    return str(path)


def test_local_start_runs_raycli_with_the_python_its_ray_script_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `ray` anywhere (a `pip --user` install has no python beside it): its first line's Python
    runs raycli; a first line that names no Python leaves Ray's own script."""
    elsewhere = _ray_script(tmp_path / "user" / "bin" / "ray", f"#!{sys.executable}")
    assert raycli.argv_here(elsewhere) == [sys.executable, "-c", raycli.RUN]
    by_env = _ray_script(tmp_path / "env" / "ray", f"#!/usr/bin/env {Path(sys.executable).name}")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert raycli.argv_here(by_env)[1:] == ["-c", raycli.RUN]
    assert Path(raycli.argv_here(by_env)[0]).samefile(sys.executable)
    launcher = tmp_path / "long" / "ray"
    _ray_script(launcher, "#!/bin/sh")
    launcher.write_text(f"#!/bin/sh\n'''exec' \"{sys.executable}\" \"$0\" \"$@\"\n' '''\n")
    assert raycli.argv_here(str(launcher)) == [sys.executable, "-c", raycli.RUN]
    no_python = _ray_script(tmp_path / "sh" / "ray", "#!/bin/bash")
    assert raycli.argv_here(no_python) == [no_python]
    gone = str(tmp_path / "nowhere" / "ray")
    assert raycli.argv_here(gone) == [gone]


def test_raycli_marks_the_groups_absent_only_for_the_ray_it_was_proven_with(tmp_path: Path) -> None:
    """The proven version: the three groups are skipped, silently. Any other (a Ray the user
    brings): Ray's CLI as its own script loads it, all three groups, and one line says why."""
    proven = fake_ray(tmp_path / "proven", raycli.PROVEN)
    other = fake_ray(tmp_path / "other", "2.9.3")
    for root, groups, note in ((proven, "0", ""), (other, "3", "plain ray: Ray 2.9.3 here")):
        run = subprocess.run([sys.executable, "-c", raycli.RUN, "start", "--head"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(root)})
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[:2] == ["ray", groups], run.stdout
        assert run.stdout.split()[-2:] == ["start", "--head"], run.stdout
        assert (note in run.stderr) if note else run.stderr == "", run.stderr
        assert len(run.stderr.splitlines()) == (1 if note else 0)


def test_raycli_is_proven_with_the_ray_installed_here() -> None:
    """The tests above prove raycli with this Ray: a Ray upgrade moves PROVEN with it."""
    import importlib.metadata

    assert importlib.metadata.version("ray") == raycli.PROVEN

"""A wheel carries templates/ and setup/, and an install of it works without the checkout.

The wheel is built from a copy of the sources (so the build leaves nothing in the checkout) and
installed, not editable, into a fresh venv that borrows this venv's dependencies through a .pth
line (installing Ray and MLflow again would take minutes). Run from a folder outside the checkout,
that install must find its own templates and node installer and plan clusters with them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from infra.core import paths

pytestmark = pytest.mark.slow  # builds a wheel and a venv (about 20 s)

SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "infra", "templates", "setup"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in SOURCES:
        original = paths.PROJECT_ROOT / name
        if original.is_dir():
            shutil.copytree(original, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_shipped"))
        else:
            shutil.copy2(original, source / name)
    out = root / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(out), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (found,) = out.glob("rayfleet-*.whl")
    return found


def test_the_wheel_contains_templates_and_setup(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("templates", "setup"):
        expected = {f"infra/_shipped/{p.relative_to(paths.PROJECT_ROOT).as_posix()}"
                    for p in (paths.PROJECT_ROOT / folder).rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts}
        assert expected and expected <= names, sorted(expected - names)
    assert "infra/node/files.py" in names


def test_an_installed_wheel_finds_its_files_and_plans_outside_the_checkout(
        wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # Without a pip of its own (ensurepip's install is most of this test's CPU): this venv's
    # pip installs into it (`--python`), as a plain, not editable, install.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = venv / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                              "-q", "--no-deps", "--no-index", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # Dependencies from this venv, after the fresh one's own packages (its `infra` comes first).
    Path(site, "borrowed-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.yaml").write_text("provider: local\nnum_cpus: 1\nport_base: 23000\n")
    (elsewhere / "hpc.yaml").write_text("provider: slurm\ncpus_per_node: 2\n")
    probe = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        from infra import providers
        from infra.cli import loading
        from infra.core import paths
        from infra.providers.slurm import script
        local_plan = providers.create(loading.load_spec(Path("mine.yaml"))).plan(None)
        batch = script.render_script(loading.load_spec(Path("hpc.yaml")))
        print(json.dumps({
            # infra/, two folders above infra/core/paths.py
            "package": str(Path(paths.__file__).resolve().parents[1]),
            "templates": str(paths.templates_dir()), "setup": str(paths.setup_dir()),
            "installer": (paths.setup_dir() / "install.sh").is_file(),
            "start": local_plan.files["start.sh"], "batch": batch[:200],
        }))
    """)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "RAYFLEET_HOME": str(tmp_path / "home")}
    run = subprocess.run([str(python), "-c", probe], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    package = Path(found["package"])
    assert package.is_relative_to(venv), found["package"]  # the installed copy, not the checkout
    assert Path(found["templates"]) == package / "_shipped" / "templates"
    assert Path(found["setup"]) == package / "_shipped" / "setup" and found["installer"]
    assert "ray" in found["start"] and "--head" in found["start"]
    assert found["batch"].startswith("#!/bin/bash")
    # Without RAYFLEET_HOME (a student after `pip install ./rayfleet`): the state under their
    # home, specs from the folder they work in; never inside site-packages.
    where = subprocess.run(
        [str(python), "-c", "from infra.core import paths; print(paths.home()); "
                            "print(paths.clusters_dir())"],
        cwd=elsewhere, env={k: v for k, v in env.items() if k != "RAYFLEET_HOME"},
        capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stderr[-3000:]
    assert where.stdout.split() == [str(tmp_path / ".rayfleet"), str(elsewhere / "clusters")]
    # The console program, once the package has one, runs from here too.
    program = venv / "bin" / "rayfleet"
    if program.exists():
        listed = subprocess.run([str(program), "--list"], cwd=elsewhere, env=env,
                                capture_output=True, text=True, timeout=300)
        assert listed.returncode == 0 and "up" in listed.stdout, listed.stderr[-2000:]

"""`environment.install`: setup/install.sh is copied next to the jobs' files and run there."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli import loading
from infra.core import versions
from infra.providers.slurm import install
from infra.providers.slurm.remote import LocalRunner, SlurmError
from infra.providers.slurm.spec import Spec
from tests.conftest import ROOT


def _spec(tmp_path: Path, activate: str, extra: str = "") -> Spec:
    path = tmp_path / "env.yaml"
    path.write_text(f"provider: slurm\ncpus_per_node: 1\nsubmit: {{workdir: {tmp_path}/work}}\n"
                    f"environment: {{install: true, activate: {activate}{extra}}}\n")
    loaded = loading.load_spec(path)
    assert isinstance(loaded, Spec)
    return loaded


def test_install_needs_a_prefix(tmp_path: Path) -> None:
    path = tmp_path / "env.yaml"
    path.write_text("provider: slurm\ncpus_per_node: 1\nenvironment: {install: true}\n")
    with pytest.raises(Exception, match="environment: install needs activate"):
        loading.load_spec(path)


def test_the_installer_gets_this_machines_pins_and_the_prefix(tmp_path: Path) -> None:
    loaded = _spec(tmp_path, "~/envs/ray", ", backend: venv")
    line = install.command(loaded)
    pins = versions.node_pins()
    assert line.startswith(f"bash {tmp_path}/work/setup/install.sh --env cpu ")
    assert f"--ray-version {pins['ray_version']} --python-version {pins['python_version']}" in line
    # metrics: prometheus (the default): Prometheus from conda-forge into the shared env, never
    # the login host's apt-get.
    assert line.endswith('--backend venv --metrics --metrics-from conda-forge '
                         '--prefix "$HOME"/envs/ray')
    unmeasured = loaded.model_copy(update={"metrics": "none"})
    assert install.command(unmeasured).endswith('--backend venv --prefix "$HOME"/envs/ray')
    gpu = _spec(tmp_path, "/envs/g", "").model_copy(update={"gpus_per_node": 2})
    assert "--env gpu" in install.command(gpu)


def test_installer_failure_is_one_line_and_files_are_uploaded(tmp_path: Path) -> None:
    # A prefix that cannot be created: the real installer fails at once.
    loaded = _spec(tmp_path, "/proc/rayfleet-no/env")
    with pytest.raises(SlurmError) as caught:
        install.install(LocalRunner(None), loaded)
    assert str(caught.value).startswith("setup/install.sh on this machine failed: ")
    assert "\n" not in str(caught.value)
    uploaded = tmp_path / "work" / "setup"
    assert (uploaded / "install.sh").read_text() == (ROOT / "setup" / "install.sh").read_text()
    assert sorted(p.name for p in (uploaded / "envs").iterdir()) == sorted(
        p.name for p in (ROOT / "setup" / "envs").iterdir())

"""The node installer (setup/install.sh), its env specs, the runtime envs and the pins.

The venv backend runs for real into temp prefixes, reusing this interpreter's packages (the pinned
Ray is importable here, so nothing is downloaded). The conda backend and the Miniforge download run
against a stand-in conda and installer (a file:// URL), since neither conda nor the internet is
here. Detection reads faked device files under RAYFLEET_SYSROOT. On the test bed, the installer
runs on every host over real SSH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from infra.core import jobs, versions
from tests.conftest import ROOT
from tests.testbed.core import Testbed

pytest_plugins = ["tests.testbed.fixtures"]

INSTALL = ROOT / "setup" / "install.sh"
PINS = versions.node_pins()
PIN_ARGS = ["--ray-version", PINS["ray_version"], "--python-version", PINS["python_version"]]


def install(*args: str, script: Path = INSTALL, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, check=False)


def venv_install(prefix: Path, *extra: str, script: Path = INSTALL,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The cpu env with this machine's pins, built from this interpreter (whose packages it reuses)."""
    return install("--env", "cpu", *PIN_ARGS, "--backend", "venv", "--python", sys.executable,
                   "--prefix", str(prefix), *extra, script=script, env=env)


def marker(prefix: Path) -> dict[str, str]:
    lines = (prefix / ".rayfleet-env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def copy_setup(tmp_path: Path) -> Path:
    """A private copy of setup/ whose env specs a test may change; returns its install.sh."""
    shutil.copytree(ROOT / "setup", tmp_path / "setup")
    return tmp_path / "setup" / "install.sh"


# ----------------------------------------------------------------------------- static checks


def test_install_sh_is_shellcheck_clean_and_parses() -> None:
    assert subprocess.run(["bash", "-n", str(INSTALL)], check=False).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian package shellcheck)")
    result = subprocess.run(["shellcheck", "--severity=style", str(INSTALL)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("kind", ["cpu", "gpu", "tpu"])
def test_env_specs_pin_python_and_ray_and_list_the_workloads(kind: str) -> None:
    text = (ROOT / "setup" / "envs" / f"environment_{kind}.yaml").read_text()
    rendered = text.replace("${PYTHON_VERSION}", "3.11").replace("${RAY_VERSION}", "2.60.0")
    spec = yaml.safe_load(rendered)
    conda = [d for d in spec["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    # conda provides only Python and pip, so both backends install the same pip list.
    assert conda == ["python=3.11", "pip"]
    assert any(r.startswith("ray[") and r.endswith("]==2.60.0") and "default" in r for r in pip)
    assert {"torch", "scikit-learn", "hydra-core"} <= set(pip)
    assert ("jax[tpu]" in pip) == (kind == "tpu")
    # `tracking: mlflow`: the head's server (with MLflow's auth) and every node's client.
    assert any(r.startswith("mlflow[auth]") for r in pip)


def test_runtime_envs_load_as_invoke_submit_uses_them() -> None:
    cpu = jobs.runtime_env(str(ROOT / "setup" / "runtime" / "cpu.yaml"), ROOT)
    tpu = jobs.runtime_env(str(ROOT / "setup" / "runtime" / "tpu.yaml"), ROOT)
    assert cpu["env_vars"]["PYTHONUNBUFFERED"] == "1"
    assert tpu["env_vars"]["RAYFLEET_TPU_CHIPS_PER_HOST"] == "4"  # a v4-8 host
    for env in (cpu, tpu):
        assert ".rayfleet/" in env["excludes"] and "multirun/" in env["excludes"]
        assert env["working_dir"] == str(ROOT)


# ----------------------------------------------------------------------------- pins


def test_node_pins_are_this_interpreter_and_its_ray() -> None:
    import importlib.metadata

    expected = {"ray_version": importlib.metadata.version("ray"),
                "python_version": f"{sys.version_info.major}.{sys.version_info.minor}"}
    assert versions.node_pins() == expected


def test_install_args_carry_the_pins_in_a_fixed_order() -> None:
    args = versions.install_args("tpu", backend="conda", prefix="/opt/env")
    assert args == ["--env", "tpu", *PIN_ARGS, "--backend", "conda", "--prefix", "/opt/env"]
    with pytest.raises(ValueError, match="env 'arm'"):
        versions.install_args("arm")


def test_mismatches_name_what_differs() -> None:
    pins = {"ray_version": "2.60.0", "python_version": "3.11"}
    assert versions.mismatches({"ray_version": "2.60.0", "python_version": "3.11.9"}, pins) == []
    found = versions.mismatches({"ray_version": "2.59.0", "python_version": "3.10.13"}, pins)
    assert found == ["Ray 2.59.0 (this machine: 2.60.0)", "Python 3.10 (this machine: 3.11)"]


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("args", "message"), [
    (["--env", "arm", *PIN_ARGS], "--env 'arm': use cpu, gpu, tpu or auto"),
    (["--env", "cpu", "--python-version", "3.11"], "--ray-version is required"),
    (["--env", "cpu", "--ray-version", "latest", "--python-version", "3.11"],
     "--ray-version 'latest': expected a version"),
    (["--env", "cpu", "--ray-version", "2.60.0"], "--python-version is required"),
    (["--env", "cpu", "--ray-version", "2.60.0", "--python-version", "3"],
     "--python-version '3': expected major.minor"),
    (["--env", "cpu", *PIN_ARGS, "--backend", "pixi"], "--backend 'pixi': use auto, conda or venv"),
    (["--env", "cpu", *PIN_ARGS, "--python", "/bin/false"], "--python /bin/false is not a working"),
    (["--env", "cpu", *PIN_ARGS, "--frobnicate"], "unknown argument '--frobnicate'"),
    (["--env", "cpu", *PIN_ARGS, "--metrics", "--metrics-from", "apt"],
     "--metrics-from 'apt': use any or conda-forge"),
])
def test_bad_arguments_fail_with_one_line_and_create_nothing(tmp_path: Path, args: list[str],
                                                               message: str) -> None:
    result = install(*args, "--prefix", str(tmp_path / "env"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"install.sh: error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- detection


def _fake_tree(root: Path, files: dict[str, str]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


@pytest.mark.parametrize(("files", "expected"), [
    ({}, "cpu"),
    ({"dev/nvidia0": "", "dev/nvidiactl": ""}, "gpu"),
    ({"dev/nvidiactl": ""}, "cpu"),  # the control device alone: driver loaded, no GPU
    ({"dev/accel0": "", "dev/accel3": ""}, "tpu"),  # TPU v2-v4 VMs
    ({"dev/vfio/0": "", "dev/vfio/vfio": "",
      "sys/bus/pci/devices/0000:00:05.0/vendor": "0x1ae0\n"}, "tpu"),  # v5e and later
    ({"dev/vfio/0": "", "sys/bus/pci/devices/0000:00:05.0/vendor": "0x10de\n"}, "cpu"),
    ({"dev/vfio/vfio": ""}, "cpu"),  # the VFIO control node alone is no device
])
def test_detects_the_accelerator_from_device_files(tmp_path: Path, files: dict[str, str],
                                                    expected: str) -> None:
    _fake_tree(tmp_path, files)
    result = install("--detect", env={"RAYFLEET_SYSROOT": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{expected}\n"


@pytest.mark.parametrize(("script", "expected"), [
    ("echo 'GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f1b)'", "gpu"),
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2; exit 9",
     "cpu"),
])
def test_detects_a_gpu_through_nvidia_smi(tmp_path: Path, script: str, expected: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"RAYFLEET_SYSROOT": str(tmp_path / "root"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    assert install("--detect", env=env).stdout == f"{expected}\n"


def test_env_auto_installs_the_detected_kind_into_its_own_default_prefix(tmp_path: Path) -> None:
    _fake_tree(tmp_path / "root", {"dev/accel0": ""})
    # A Python that does not exist stops the run right after detection and prefix choice.
    result = install("--env", "auto", "--ray-version", "2.60.0", "--python-version", "3.1",
                     "--backend", "venv",
                     env={"RAYFLEET_SYSROOT": str(tmp_path / "root"), "HOME": str(tmp_path / "home")})
    assert result.returncode == 1
    assert "detected accelerator: tpu" in result.stderr
    assert f"into {tmp_path}/home/.local/share/rayfleet/envs/tpu" in result.stderr
    assert result.stderr.strip().endswith("no Python 3.1 found for the venv backend (tried "
                                          "python3.1, python3, python); install it, pass --python, "
                                          "or use --backend conda")


# ----------------------------------------------------------------------------- the venv backend


@pytest.mark.slow  # installs Ray into a real venv with pip: a minute, not seconds
def test_venv_backend_installs_for_real_then_a_second_run_is_a_no_op(tmp_path: Path) -> None:
    prefix = tmp_path / "envs" / "cpu"
    started = time.monotonic()
    first = venv_install(prefix)
    first_s = time.monotonic() - started
    assert first.returncode == 0, first.stderr
    assert "reuses its packages" in first.stderr  # nothing downloaded
    assert first.stdout.startswith("rayfleet env installed in ")
    assert f"ray:      {prefix}/bin/ray\n" in first.stdout
    assert marker(prefix) | {"installed_at": ""} == {
        "env": "cpu", "backend": "venv", "ray_version": PINS["ray_version"],
        "python_version": PINS["python_version"], "installed_at": "",
        "spec_sha256": marker(prefix)["spec_sha256"]}
    # The env's own interpreter and `ray` command run the pinned versions.
    ray_version = subprocess.run([str(prefix / "bin" / "ray"), "--version"], capture_output=True,
                                 text=True, check=True).stdout
    assert PINS["ray_version"] in ray_version
    probe = subprocess.run([str(prefix / "bin" / "python"), "-c",
                            "import sys, ray; print(sys.prefix, ray.__version__)"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert probe == [str(prefix), PINS["ray_version"]]
    # The pip list is exactly the spec's, and activation turns usage statistics off.
    spec = yaml.safe_load((prefix / "rayfleet-environment.yaml").read_text())
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    assert (prefix / "rayfleet-requirements.txt").read_text().splitlines() == pip
    activate = (prefix / "rayfleet-activate.sh").read_text()
    assert "export RAY_USAGE_STATS_ENABLED=0" in activate
    assert f'export PATH="{prefix}/bin:$PATH"' in activate
    assert "RAY_USAGE_STATS_ENABLED=0" in (prefix / "bin" / "activate").read_text()
    assert (tmp_path / "envs" / "cpu.install.log").read_text().count("installed in") == 1

    before = {p: p.stat().st_mtime_ns for p in prefix.rglob("*") if p.is_file()}
    started = time.monotonic()
    second = venv_install(prefix)
    second_s = time.monotonic() - started
    print(f"\ninstall.sh venv backend: first run {first_s:.2f}s, second run {second_s:.2f}s")
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("rayfleet env already installed in ")
    assert "+ " not in second.stderr  # ran no command: no venv, no pip
    assert {p: p.stat().st_mtime_ns for p in prefix.rglob("*") if p.is_file()} == before


@pytest.mark.slow  # installs Ray into a real venv with pip: a minute, not seconds
def test_concurrent_runs_on_one_prefix_install_once(tmp_path: Path) -> None:
    prefix = tmp_path / "env"
    argv = ["bash", str(INSTALL), "--env", "cpu", *PIN_ARGS, "--backend", "venv",
            "--python", sys.executable, "--prefix", str(prefix)]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(3)]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], outputs
    firsts = sorted(out.split(" in ")[0] for out, _ in outputs)
    assert firsts == ["rayfleet env already installed", "rayfleet env already installed",
                      "rayfleet env installed"]
    assert sum("is running; waiting for it" in err for _, err in outputs) >= 1


@pytest.mark.slow  # installs Ray into a real venv with pip: a minute, not seconds
def test_a_changed_env_spec_or_a_broken_env_is_rebuilt(tmp_path: Path) -> None:
    script = copy_setup(tmp_path)
    prefix = tmp_path / "env"
    assert venv_install(prefix, script=script).returncode == 0
    digest = marker(prefix)["spec_sha256"]

    spec = script.parent / "envs" / "environment_cpu.yaml"
    spec.write_text(spec.read_text().replace("      - numpy\n", "      - numpy\n      - pyyaml\n"))
    changed = venv_install(prefix, script=script)
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.startswith("rayfleet env installed")
    assert "removing the previous env" in changed.stderr
    assert marker(prefix)["spec_sha256"] != digest
    assert "pyyaml" in (prefix / "rayfleet-requirements.txt").read_text().split()

    (prefix / "bin" / "python").unlink()  # someone broke the env by hand
    repaired = venv_install(prefix, script=script)
    assert repaired.stdout.startswith("rayfleet env installed"), repaired.stderr
    assert (prefix / "bin" / "python").exists()


@pytest.mark.slow  # installs Ray into a real venv with pip: a minute, not seconds
def test_a_foreign_prefix_is_refused_and_an_interrupted_one_is_replaced(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("not ours")
    refused = venv_install(foreign)
    assert refused.returncode == 1
    assert refused.stderr.strip().endswith(
        f"install.sh: error: {foreign} exists and was not made by install.sh; "
        "remove it or pass another --prefix")
    assert (foreign / "precious.txt").read_text() == "not ours"

    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    (interrupted / ".rayfleet-partial").write_text("")
    (interrupted / "half-written").write_text("")
    result = venv_install(interrupted)
    assert result.returncode == 0, result.stderr
    assert not (interrupted / "half-written").exists()
    assert not (interrupted / ".rayfleet-partial").exists()


def test_a_failing_step_exits_non_zero_naming_it_with_the_log_tail(tmp_path: Path) -> None:
    script = copy_setup(tmp_path)
    spec = script.parent / "envs" / "environment_cpu.yaml"
    spec.write_text(spec.read_text().replace("      - numpy\n",
                                             "      - numpy\n      - rayfleet-no-such-package\n"))
    prefix = tmp_path / "env"
    # No index at all: pip fails at once instead of asking PyPI.
    result = venv_install(prefix, script=script, env={"PIP_NO_INDEX": "1"})
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    error = next(line for line in lines if line.startswith("install.sh: error: "))
    assert "-m pip install --disable-pip-version-check -r" in error and "failed with exit code" in error
    assert any("rayfleet-no-such-package" in line for line in lines[lines.index(error):])
    assert (prefix / ".rayfleet-partial").exists() and not (prefix / ".rayfleet-env").exists()
    assert "rayfleet-no-such-package" in (tmp_path / "env.install.log").read_text()


# ----------------------------------------------------------------------------- the conda backend

_FAKE_CONDA = '''#!{python}
"""A stand-in for conda: the two calls setup/install.sh makes, done with venv and pip."""
import os, subprocess, sys, yaml
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["FAKE_CONDA_CALLS"], "a") as calls:
    calls.write(" ".join(args) + "\\n")
prefix = args[args.index("--prefix") + 1]
if args[0] == "create":
    assert "--yes" in args and "pip" in args, args
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", prefix], check=True)
    purelib = subprocess.run([prefix + "/bin/python", "-c",
                              "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "base.pth").write_text("".join(
        f"import site; site.addsitedir({{p!r}})\\n" for p in sys.path if p.endswith("site-packages")))
elif args[:2] == ["env", "update"]:
    # What conda's pip would install, each a valid requirement, recorded and not installed: the
    # env already sees this interpreter's packages (base.pth), Ray among them, which is what
    # install.sh checks; whether this machine has the examples' extras is not this test's point.
    from packaging.requirements import Requirement
    spec = yaml.safe_load(Path(args[args.index("--file") + 1]).read_text())
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    for requirement in pip:
        if not requirement.startswith("-"):
            Requirement(requirement)
    Path(os.environ["FAKE_CONDA_CALLS"] + ".pip").write_text("\\n".join(pip) + "\\n")
else:
    sys.exit(f"fake conda: unexpected call {{args}}")
'''

_FAKE_MINIFORGE_INSTALLER = '''#!/usr/bin/env bash
# A stand-in for Miniforge3-Linux-x86_64.sh: `bash it -b -p DIR` puts a conda into DIR/bin.
set -euo pipefail
[[ "$1" == -b && "$2" == -p ]] || exit 64
mkdir -p "$3/bin"
cp "$FAKE_CONDA_SOURCE" "$3/bin/conda"
chmod 755 "$3/bin/conda"
echo "installed Miniforge into $3"
'''


def test_conda_backend_downloads_miniforge_when_no_conda_exists(tmp_path: Path) -> None:
    if shutil.which("curl") is None and shutil.which("wget") is None:
        pytest.skip("neither curl nor wget is installed")
    fake_conda = tmp_path / "fake-conda"
    fake_conda.write_text(_FAKE_CONDA.format(python=sys.executable))
    installer = tmp_path / "Miniforge3.sh"
    installer.write_text(_FAKE_MINIFORGE_INSTALLER)
    calls = tmp_path / "conda-calls.log"
    env = {
        "HOME": str(tmp_path / "home"),
        "RAYFLEET_MINIFORGE_URL": f"file://{installer}",
        "FAKE_CONDA_SOURCE": str(fake_conda),
        "FAKE_CONDA_CALLS": str(calls),
        # No conda anywhere on PATH, whatever this machine has.
        "PATH": ":".join(p for p in os.environ["PATH"].split(":")
                         if not shutil.which("conda", path=p) and not shutil.which("mamba", path=p)),
    }
    env.pop("CONDA_EXE", None)
    prefix = tmp_path / "env"
    args = ["--env", "gpu", *PIN_ARGS, "--backend", "conda", "--prefix", str(prefix)]
    result = install(*args, env={**env, "CONDA_EXE": ""})
    assert result.returncode == 0, result.stderr
    miniforge = tmp_path / "home" / "miniforge3"
    assert f"installing Miniforge into {miniforge}" in result.stderr
    assert marker(prefix)["backend"] == "conda" and marker(prefix)["env"] == "gpu"
    recorded = calls.read_text().splitlines()
    assert recorded == [
        f"create --yes --quiet --prefix {prefix} python={PINS['python_version']} pip",
        f"env update --quiet --prefix {prefix} --file {recorded[1].split('--file ')[1]}",
    ]
    spec = yaml.safe_load((prefix / "rayfleet-environment.yaml").read_text())
    asked = Path(f"{calls}.pip").read_text().splitlines()
    assert asked == next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    assert f"ray[default,tune,train]=={PINS['ray_version']}" in asked and "torch" in asked
    hook = prefix / "etc" / "conda" / "activate.d" / "rayfleet.sh"
    assert "export RAY_USAGE_STATS_ENABLED=0" in hook.read_text()
    assert "CONDA_PREFIX" in (prefix / "rayfleet-activate.sh").read_text()

    # The next env finds the Miniforge installed before: no second download.
    installer.unlink()
    second = install("--env", "cpu", *PIN_ARGS, "--backend", "conda", "--prefix",
                     str(tmp_path / "env2"), env={**env, "CONDA_EXE": ""})
    assert second.returncode == 0, second.stderr
    assert "installing Miniforge" not in second.stderr
    assert f"using {miniforge}/bin/conda" in second.stderr


# ----------------------------------------------------------------------------- on the test bed


@pytest.mark.slow
def test_installer_runs_on_every_test_bed_host_over_ssh(testbed: Testbed) -> None:
    prefix = "/root/.local/share/rayfleet/envs/cpu"  # the default, inside each host's own /root
    command = (f"bash {INSTALL} --env auto {' '.join(PIN_ARGS)} --backend venv "
               f"--python {sys.executable}")
    try:
        # All hosts at once, as `ray up` runs setup commands: one SSH session each.
        sessions = [subprocess.Popen(host.ssh_argv(command), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for host in testbed.hosts]
        outputs = [session.communicate(timeout=600) for session in sessions]
        for host, session, (out, err) in zip(testbed.hosts, sessions, outputs, strict=True):
            assert session.returncode == 0, f"{host.name}: {err}"
            assert "detected accelerator: cpu" in err
            assert out.startswith("rayfleet env installed"), out
        for host in testbed.hosts:
            again = host.ssh(command, check=False)
            assert again.returncode == 0, again.stderr
            assert again.stdout.startswith("rayfleet env already installed"), again.stdout
            ray = host.ssh(f". {prefix}/rayfleet-activate.sh && command -v ray && ray --version "
                           "&& echo $RAY_USAGE_STATS_ENABLED", check=True).stdout.split("\n")
            assert ray[0] == f"{prefix}/bin/ray"
            assert PINS["ray_version"] in ray[1] and ray[2] == "0"
    finally:
        for host in testbed.hosts:
            host.run(f"rm -rf {prefix} {prefix}.lock {prefix}.install.log", check=False)


def test_install_help_lists_every_option() -> None:
    result = install("--help")
    assert result.returncode == 0
    for option in ("--env", "--ray-version", "--python-version", "--backend", "--prefix", "--log",
                   "--python", "--isolated", "--lock-timeout", "--detect", "--metrics",
                   "--metrics-from", "conda-forge"):
        assert option in result.stdout
    assert result.stdout.startswith("rayfleet node installer")

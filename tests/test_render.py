"""Rendering: strict templates, quoting that stops injection, golden files, Ray's validation."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra import providers
from infra.cli import loading
from infra.core import paths, render
from infra.core.render import RenderError
from infra.node import where
from tests.golden import assert_golden

CASES = {
    "default": "provider: local\nobject_store_memory_mb: 512\n",
    "full": "provider: local\nnum_cpus: 4\nnum_gpus: 1\nobject_store_memory_mb: 200\n"
            "port_base: 23000\nresources: {special: 2, 'we ird': 0.5}\n",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_local_start_script_matches_golden(tmp_path: Path, rf_home: Path, case: str) -> None:
    path = tmp_path / f"golden-{case}.yaml"
    path.write_text(CASES[case] + "port_base: 23000\n" * ("port_base" not in CASES[case]))
    plan = providers.create(loading.load_spec(path)).plan(None)
    assert_golden(f"local/{case}.start.sh", plan.files["start.sh"],
                  {sys.executable: "<python>",
                   where.ray_executable(): "<ray>",
                   str(Path(where.ray_executable()).parent): "<ray-bin>",
                   str(rf_home): "<rayfleet-home>",
                   str(paths.setup_dir()): "<setup>"})
    # What we render must be a valid shell script.
    check = subprocess.run(["bash", "-n", "-c", plan.files["start.sh"]], capture_output=True)
    assert check.returncode == 0, check.stderr


def test_rendering_is_deterministic(tmp_path: Path, rf_home: Path) -> None:
    path = tmp_path / "same.yaml"
    path.write_text(CASES["full"])
    first = providers.create(loading.load_spec(path)).plan(None).files
    second = providers.create(loading.load_spec(path)).plan(None).files
    assert first == second


def test_missing_variable_is_an_error_not_an_empty_string() -> None:
    with pytest.raises(RenderError, match="is undefined; pass it from the provider"):
        render.render("local.start.sh.j2", cluster="x")


HOSTILE = "x'; touch /tmp/pwned #\nkey: injected"


def test_shell_and_yaml_filters_neutralise_hostile_values(tmp_path: Path) -> None:
    env = render.environment()
    as_yaml = env.from_string("name: {{ value | tojson }}\nother: 1\n").render(value=HOSTILE)
    assert yaml.safe_load(as_yaml) == {"name": HOSTILE, "other": 1}
    as_shell = env.from_string("echo {{ value | shq }}").render(value=HOSTILE)
    assert shlex.split(as_shell) == ["echo", HOSTILE]
    out = subprocess.run(["bash", "-c", as_shell], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout == HOSTILE + "\n"
    assert not Path("/tmp/pwned").exists()


LOCAL_TYPE_CONFIG = """
cluster_name: lab
provider:
  type: local
  head_ip: 10.200.0.11
  worker_ips: [10.200.0.12]
auth:
  ssh_user: ubuntu
  ssh_private_key: /keys/id_ed25519
"""


def test_ray_validation_accepts_a_good_cluster_config() -> None:
    prepared = render.validate_ray_cluster_config(LOCAL_TYPE_CONFIG, "lab.yaml")
    assert set(prepared["available_node_types"]) == {"local.cluster.node"}
    assert prepared["head_node_type"] == "local.cluster.node"


def test_ray_validation_rejects_unknown_keys_with_one_line() -> None:
    with pytest.raises(RenderError) as caught:
        render.validate_ray_cluster_config(LOCAL_TYPE_CONFIG + "surprise_key: 1\n", "lab.yaml")
    assert "lab.yaml: Ray rejects the cluster config" in str(caught.value)
    assert "surprise_key" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_ray_validation_rejects_wrong_types() -> None:
    with pytest.raises(RenderError, match="Ray rejects"):
        render.validate_ray_cluster_config(LOCAL_TYPE_CONFIG + "max_workers: many\n", "lab.yaml")

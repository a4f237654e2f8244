"""gcp-tpu spec -> Ray cluster YAML: TPU facts checked against Ray, Ray's own validation and TPU
classification for every example spec and every generation, golden files, one-line spec errors."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import providers
from infra.cli import loading
from infra.core import node_start, paths
from infra.core.errors import SpecError
from infra.providers.gcp_tpu import config, tpu
from tests import node_conf
from tests.conftest import ROOT
from tests.gcp_tpu.conftest import write_spec
from tests.golden import assert_golden

# accelerator type -> (chips, hosts, chips per host, default runtime), from Google's TPU docs.
GENERATIONS_TABLE = {
    "v2-8": (4, 1, 4, "tpu-ubuntu2204-base"),
    "v2-32": (16, 4, 4, "tpu-ubuntu2204-base"),
    "v3-8": (4, 1, 4, "tpu-ubuntu2204-base"),
    "v3-32": (16, 4, 4, "tpu-ubuntu2204-base"),
    "v4-8": (4, 1, 4, "tpu-ubuntu2204-base"),
    "v4-16": (8, 2, 4, "tpu-ubuntu2204-base"),
    "v4-32": (16, 4, 4, "tpu-ubuntu2204-base"),
    "v5litepod-1": (1, 1, 1, "v2-alpha-tpuv5-lite"),
    "v5litepod-4": (4, 1, 4, "v2-alpha-tpuv5-lite"),
    "v5litepod-8": (8, 1, 8, "v2-alpha-tpuv5-lite"),
    "v5litepod-16": (16, 4, 4, "v2-alpha-tpuv5-lite"),
    "v5p-8": (4, 1, 4, "v2-alpha-tpuv5"),
    "v5p-16": (8, 2, 4, "v2-alpha-tpuv5"),
    "v6e-1": (1, 1, 1, "v2-alpha-tpuv6e"),
    "v6e-4": (4, 1, 4, "v2-alpha-tpuv6e"),
    "v6e-8": (8, 1, 8, "v2-alpha-tpuv6e"),
    "v6e-16": (16, 4, 4, "v2-alpha-tpuv6e"),
}

# (type, topology) -> the accelerator type it is.
TOPOLOGIES = {
    ("V4", "2x2x1"): "v4-8",
    ("v4", "2x2x2"): "v4-16",
    ("V5LITE_POD", "2x4"): "v5litepod-8",
    ("v5litepod", "1x1"): "v5litepod-1",
    ("V5P", "2x2x1"): "v5p-8",
    ("V6E", "2x2"): "v6e-4",
    ("V6E", "4x4"): "v6e-16",
}


@pytest.mark.parametrize("accelerator_type", sorted(GENERATIONS_TABLE))
def test_slice_facts_match_the_table_and_ray(accelerator_type: str) -> None:
    from ray._private.accelerators import tpu as ray_tpu

    chips, hosts, per_host, runtime = GENERATIONS_TABLE[accelerator_type]
    shape = tpu.from_accelerator_type(accelerator_type)
    assert (shape.chips, shape.hosts, shape.chips_per_host) == (chips, hosts, per_host)
    assert shape.generation.default_runtime == runtime
    # Ray computes the same from the same name (what its TPU autoscaling relies on).
    assert ray_tpu.get_num_tpu_visible_chips_per_host(accelerator_type) == per_host
    assert ray_tpu.get_total_chips_from_accelerator_type(accelerator_type) == chips


@pytest.mark.parametrize(("type_name", "topology"), sorted(TOPOLOGIES))
def test_topology_gives_the_same_accelerator_type_as_ray(type_name: str, topology: str) -> None:
    from ray._private.accelerators import tpu as ray_tpu
    from ray.autoscaler._private.gcp.config import tpu_accelerator_config_to_type

    shape = tpu.from_topology(type_name, topology)
    assert shape.accelerator_type == TOPOLOGIES[(type_name, topology)]
    expected = tpu.generation(type_name).config_type
    assert tpu_accelerator_config_to_type({"type": expected, "topology": topology}) \
        == shape.accelerator_type
    assert ray_tpu.get_chips_per_host(topology, shape.generation.name) == shape.chips_per_host


def _plan(path: Path) -> tuple[Any, dict[str, Any]]:
    loaded = loading.load_spec(path)
    result = providers.create(loaded).plan(None)
    text = result.files[config.FILE_NAME]
    return result, config.check_with_ray(text, str(path))


def _classify(prepared: dict[str, Any]) -> dict[str, str]:
    from ray.autoscaler._private.gcp.config import _is_head_node_a_tpu, get_node_type

    assert not _is_head_node_a_tpu(prepared)
    return {name: get_node_type(t["node_config"]).value
            for name, t in prepared["available_node_types"].items()}


@pytest.mark.parametrize("accelerator_type", sorted(GENERATIONS_TABLE))
def test_every_generation_renders_to_a_tpu_node_type_ray_accepts(
        tmp_path: Path, rf_home: Path, accelerator_type: str) -> None:
    _, _, per_host, runtime = GENERATIONS_TABLE[accelerator_type]
    path = write_spec(tmp_path, tpu_workers={"tpu": {"accelerator_type": accelerator_type}})
    _, prepared = _plan(path)
    assert _classify(prepared) == {"head": "compute", "cpu": "compute", "tpu": "tpu"}
    tpu_type = prepared["available_node_types"]["tpu"]
    assert tpu_type["resources"]["TPU"] == per_host
    # Ray's fill-in marks worker 0 of every slice, which TPU pod scheduling depends on.
    assert tpu_type["resources"][f"TPU-{accelerator_type}-head"] == 1
    assert tpu_type["node_config"]["runtimeVersion"] == runtime
    assert "machineType" not in tpu_type["node_config"]
    assert prepared["available_node_types"]["head"]["resources"] == {"CPU": 0}


@pytest.mark.parametrize(("type_name", "topology"), sorted(TOPOLOGIES))
def test_type_and_topology_render_to_accelerator_config(
        tmp_path: Path, rf_home: Path, type_name: str, topology: str) -> None:
    path = write_spec(tmp_path, tpu_workers={"tpu": {"accelerator_config": {
        "type": type_name, "topology": topology}}})
    _, prepared = _plan(path)
    node_config = prepared["available_node_types"]["tpu"]["node_config"]
    assert node_config["acceleratorConfig"] == {"type": tpu.generation(type_name).config_type,
                                                "topology": topology}
    assert "acceleratorType" not in node_config
    assert _classify(prepared)["tpu"] == "tpu"
    shape = tpu.from_topology(type_name, topology)
    assert prepared["available_node_types"]["tpu"]["resources"]["TPU"] == shape.chips_per_host


EXAMPLES = sorted(p.name for p in (ROOT / "clusters").glob("gcp-tpu*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_specs_pass_ray_validation_and_classification(rf_home: Path, example: str) -> None:
    result, prepared = _plan(ROOT / "clusters" / example)
    kinds = _classify(prepared)
    loaded = loading.load_spec(ROOT / "clusters" / example)
    assert kinds == {"head": "compute", **dict.fromkeys(loaded.cpu_workers, "compute"),  # type: ignore[attr-defined]
                     **dict.fromkeys(loaded.tpu_workers, "tpu")}  # type: ignore[attr-defined]
    assert prepared["provider"]["type"] == "gcp"
    # Without credentials the plan still renders, and names the failed pre-flight as a problem.
    assert any("no Google credentials found" in problem for problem in result.problems)


def test_examples_exist_and_every_key_is_commented() -> None:
    """Like Ray's example-full.yaml: a comment directly above every key of the full example."""
    assert {"gcp-tpu.yaml", "gcp-tpu-minimal.yaml"} <= set(EXAMPLES)
    lines = (ROOT / "clusters" / "gcp-tpu.yaml").read_text().splitlines()
    keys = 0
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        keys += 1
        assert lines[i - 1].strip().startswith("#"), \
            f"clusters/gcp-tpu.yaml line {i + 1}: {stripped.split(':')[0]!r} has no comment above it"
    assert keys > 30


def _normalise() -> dict[str, str]:
    pins = (importlib.metadata.version("ray"), f"{sys.version_info.major}.{sys.version_info.minor}")
    return {
        str(paths.home()): "<RAYFLEET_HOME>",
        str(paths.setup_dir()): "<project>/setup",
        f"--ray-version {pins[0]}": "--ray-version <ray>",
        f"--python-version {pins[1]}": "--python-version <python>",
        importlib.metadata.version("google-api-python-client"): "<version>",
    }


GOLDEN_CASES: dict[str, dict[str, Any]] = {
    "base": {},
    "firewall-subnet-labels": {
        "dashboard": {"port": 8300, "allowed_source_ranges": ["198.51.100.0/24", "2001:db8::/32"]},
        "subnetwork": "lab-subnet", "labels": {"course": "cs-101"}, "region": "us-central2",
        "cpu_workers": {"small": {"machine_type": "e2-standard-2", "provisioning": "preemptible",
                                  "min_workers": 1, "max_workers": 3}},
        "tpu_workers": {"pod": {"accelerator_config": {"type": "V4", "topology": "2x2x2"},
                                "runtime_version": "tpu-vm-base", "provisioning": "standard"}},
    },
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_rendered_config_matches_golden(tmp_path: Path, rf_home: Path, case: str) -> None:
    path = write_spec(tmp_path, name="golden", **GOLDEN_CASES[case])
    result, _ = _plan(path)
    text = result.files[config.FILE_NAME].replace(str(path), "<spec>")
    assert_golden(f"gcp-tpu/{case}.yaml", text, _normalise())


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_configs_match_golden(rf_home: Path, example: str) -> None:
    result, _ = _plan(ROOT / "clusters" / example)
    assert_golden(f"gcp-tpu/example-{example}", result.files[config.FILE_NAME], _normalise())
    if example == "gcp-tpu.yaml":  # how its nodes start Ray (node.sh reads it)
        assert_golden("gcp-tpu/example-gcp-tpu.node.conf", result.files[node_start.CONF_NAME])


def test_rendering_is_deterministic_and_keeps_secrets_out(tmp_path: Path, rf_home: Path) -> None:
    key = tmp_path / "sa.json"
    key.write_text('{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----x"}')
    path = write_spec(tmp_path, credentials_file=str(key))
    first, _ = _plan(path)
    second, _ = _plan(path)
    assert first.files == second.files
    text = first.files[config.FILE_NAME]
    assert "PRIVATE KEY" not in text and "gcp_credentials" not in text
    parsed = yaml.safe_load(text)
    assert parsed["auth"]["ssh_private_key"] == str(paths.keys_dir("tpucls") / "id_ed25519")


def test_dashboard_binds_loopback_unless_ranges_are_given(tmp_path: Path, rf_home: Path) -> None:
    closed, _ = _plan(write_spec(tmp_path, name="closed"))
    opened, _ = _plan(write_spec(tmp_path, name="opened",
                                 dashboard={"allowed_source_ranges": ["203.0.113.0/24"]}))
    assert "--dashboard-host=127.0.0.1" in closed.files[node_start.CONF_NAME]
    assert "--dashboard-host=0.0.0.0" in opened.files[node_start.CONF_NAME]
    assert not any(r.kind.startswith("firewall") for r in closed.resources)
    rule = next(r for r in opened.resources if r.kind.startswith("firewall"))
    assert rule.name == "rayfleet-opened-dashboard" and "203.0.113.0/24" in rule.detail


def test_hostile_values_cannot_add_yaml_keys(tmp_path: Path, rf_home: Path) -> None:
    path = write_spec(tmp_path, labels={"note": "x"}, head={
        "machine_type": "n2-standard-4", "image": 'evil"\nprovider: {type: local}\n#'})
    _, prepared = _plan(path)
    assert prepared["provider"]["type"] == "gcp"
    head = prepared["available_node_types"]["head"]["node_config"]
    assert head["disks"][0]["initializeParams"]["sourceImage"].startswith('evil"\nprovider')


BAD = [
    ({"tpu_workers": {"t": {"accelerator_type": "v5e-8"}}}, "is called 'v5litepod-8'"),
    ({"tpu_workers": {"t": {"accelerator_type": "v4-7"}}}, "TensorCores"),
    ({"tpu_workers": {"t": {"accelerator_type": "v4-4"}}}, "the smallest v4 slice is v4-8"),
    ({"tpu_workers": {"t": {"accelerator_type": "v9-8"}}}, "unknown TPU generation 'v9'"),
    ({"tpu_workers": {"t": {"accelerator_type": "v4-8",
                            "accelerator_config": {"type": "V4", "topology": "2x2x1"}}}},
     "give exactly one of accelerator_type"),
    ({"tpu_workers": {"t": {}}}, "give exactly one of accelerator_type"),
    ({"tpu_workers": {"t": {"accelerator_config": {"type": "V2", "topology": "2x2"}}}},
     "cannot be given as a topology"),
    ({"tpu_workers": {"t": {"accelerator_config": {"type": "V4", "topology": "2x4"}}}},
     "v4 topologies have 3 dimensions"),
    ({"tpu_workers": {"t": {"acelerator_type": "v4-8"}}}, "did you mean 'accelerator_type'?"),
    ({"tpu_workers": {"t": {"accelerator_type": "v4-8", "provisioning": "spott"}}},
     "did you mean 'spot'?"),
    ({"tpu_workers": {"t": {"accelerator_type": "v4-8", "min_workers": 3, "max_workers": 1}}},
     "min_workers (3) is above max_workers (1)"),
    ({"zone": "us-central2"}, "is not a zone like us-central2-b"),
    ({"region": "europe-west4"}, "does not contain zone"),
    ({"project": "My Project"}, "is not a GCP project id"),
    ({"labels": {"rayfleet-cluster": "x"}}, "is set by rayfleet/Ray itself"),
    ({"labels": {"rayfleet-owner": "x"}}, "is set by rayfleet/Ray itself"),
    ({"auth": "none", "dashboard": {"allowed_source_ranges": ["198.51.100.0/24"]}},
     "with auth: none would let anyone in those ranges run code"),
    ({"labels": {"Course": "x"}}, "is not a valid GCP label"),
    ({"dashboard": {"allowed_source_ranges": ["0.0.0.0/0"]}}, "whole internet"),
    ({"dashboard": {"allowed_source_ranges": ["10.0.0.1/24"]}}, "host bits must be zero"),
    ({"cpu_workers": {"c": {"machine_type": "mystery"}}}, "set cpus:"),
    ({"cpu_workers": {"head": {}}}, "not be 'head'"),
    ({"credentials_file": "/nonexistent/key.json"}, "no such file"),
    ({"max_workers": 0}, "below the sum of min_workers"),
]


@pytest.mark.parametrize(("changes", "expected"), BAD, ids=[e for _, e in BAD])
def test_bad_specs_give_one_line_naming_the_field(tmp_path: Path, changes: dict[str, Any],
                                                  expected: str) -> None:
    path = write_spec(tmp_path, **changes)
    with pytest.raises(SpecError) as caught:
        loading.load_spec(path)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message and message.startswith(str(path))
    assert caught.value.exit_code == 2


def test_importing_the_provider_imports_no_cloud_sdk_ray_or_paramiko() -> None:
    import subprocess

    code = ("import sys, infra.providers.gcp_tpu\n"
            "heavy = [m for m in ('ray', 'googleapiclient', 'google.auth', 'paramiko', 'jinja2')"
            " if m in sys.modules]\n"
            "print(heavy)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_tracking_password_reaches_every_node_as_a_file_never_in_the_config(
        tmp_path: Path, rf_home: Path) -> None:
    from infra.core.tracking import client as tracking

    secret = tracking.ensure_credentials("tracked").read_text().strip()
    result, prepared = _plan(write_spec(tmp_path, name="tracked", tracking="mlflow"))
    text = result.files[config.FILE_NAME]
    assert secret not in text
    assert prepared["file_mounts"]["~/.rayfleet/mlflow-password"] == \
        str(tracking.password_path("tracked"))
    # The start lines name node.sh; node.conf says what it runs (tests/test_node_start.py).
    assert prepared["head_start_ray_commands"] == [node_start.command("head")]
    assert prepared["worker_start_ray_commands"] == [node_start.command("worker")]
    conf = result.files[node_start.CONF_NAME]
    # As Ray's user, from that user's 0600 copy ($HOME is that user's: its shell runs the words).
    for role, url in (("head", "http://$rf_ip:5000"), ("worker", "http://$RAY_HEAD_IP:5000")):
        words = node_conf.words(conf, role)
        assert f'MLFLOW_TRACKING_URI="{url}" MLFLOW_TRACKING_USERNAME="rayfleet" ' \
               'MLFLOW_TRACKING_PASSWORD="$(cat "$HOME/.rayfleet/mlflow-password")" ' in words, words
    assert node_conf.array(conf, "worker_files") == ["ray:.rayfleet/ray-token",
                                                     "ray:.rayfleet/mlflow-password"]
    # Only the dashboard's port is ever opened by a firewall rule; tracking adds none.
    assert not any(r.kind.startswith("firewall") for r in result.resources)
    untracked, _ = _plan(write_spec(tmp_path, name="untracked"))
    assert "MLFLOW" not in untracked.files[config.FILE_NAME]

"""The autoscaler configs of Lambda and Slurm, rendered from templates/*.autoscaler.yaml.j2: golden
files, Ray's own validation, and values that YAML could misread (or that try to add keys) staying
the values they were.

The golden files were first checked equal, parsed, to what the code before the templates built
(a dict through yaml.safe_dump for Lambda, through json.dumps for Slurm; commit 0826d80)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.cli.loading import load_spec
from infra.core import render, versions
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud import autoscale
from infra.providers.lambda_cloud.spec import Spec as LambdaSpec
from infra.providers.slurm import script as slurm_script
from infra.providers.slurm.spec import Spec as SlurmSpec
from tests.golden import assert_golden

A10 = {"instance_type": "gpu_1x_a10", "region": "us-east-1"}
A100 = {"instance_type": "gpu_1x_a100_sxm4", "region": "us-east-1"}
LAMBDA_BASE: dict[str, Any] = {"provider": "lambda", "head": {"choices": [A10]}}

LAMBDA_CASES: dict[str, dict[str, Any]] = {
    "minimal": {"worker_types": {"gpu": {"choices": [A10, A100], "max_workers": 4}}},
    # Token auth, tracking, no node environment, the object store, two types (one with its own
    # resources, names YAML would read as booleans and numbers).
    "full": {"auth": "token", "tracking": "mlflow", "env": "none", "object_store_memory_mb": 2048,
             "idle_timeout_minutes": 7.5, "ssh_user": "ubuntu",
             "worker_types": {"gpu": {"choices": [A100], "min_workers": 1, "max_workers": 2},
                              "on": {"choices": [A10], "max_workers": 3,
                                     "resources": {"CPU": 30, "yes": 1, "null": 2}}}},
    "conda": {"env": "gpu", "env_backend": "conda", "metrics": "prometheus",
              "worker_types": {"gpu": {"choices": [A10], "max_workers": 1}}},
}
TYPES = {"gpu_1x_a10": api.InstanceType("gpu_1x_a10", "1x A10", 75, {"vcpus": 30, "gpus": 1},
                                        ("us-east-1",)),
         "gpu_1x_a100_sxm4": api.InstanceType("gpu_1x_a100_sxm4", "1x A100", 129,
                                              {"vcpus": 30, "gpus": 1}, ())}

SLURM_BASE = "provider: slurm\ncpus_per_node: 2\n"
SLURM_CASES = {
    "minimal": SLURM_BASE + "worker_types:\n  cpu: {cpus_per_node: 4, max_workers: 3}\n",
    "full": SLURM_BASE + "partition: cpu\ntime_limit: '4:00:00'\nidle_timeout_minutes: 2\n"
                         "gpus_per_node: 1\nresources: {head_only: 1}\n"
                         "object_store_memory_mb: 300\nextra_sbatch_options: [--mail-type=END]\n"
                         "worker_types:\n  cpu: {cpus_per_node: 4, max_workers: 3}\n"
                         "  gpu: {partition: gpu, cpus_per_node: 8, gpus_per_node: 2, "
                         "gpu_type: a100, memory_per_node_mb: 64000, time_limit: '1:00:00', "
                         "min_workers: 1, max_workers: 2, resources: {gpu_node: 1, 'off': 2}, "
                         "labels: {tier: gpu, 'yes': 'no', zone: '0123', note: 'a: b # c', "
                         "flow: '{x: [1]}', empty: ''}}\n",
}


def _lambda_spec(tmp_path: Path, case: str) -> LambdaSpec:
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump({**LAMBDA_BASE, **LAMBDA_CASES[case]}))
    spec = load_spec(path)
    assert isinstance(spec, LambdaSpec)
    return spec


def _slurm_spec(tmp_path: Path, case: str) -> SlurmSpec:
    path = tmp_path / "auto.yaml"
    path.write_text(SLURM_CASES[case])
    spec = load_spec(path)
    assert isinstance(spec, SlurmSpec)
    return spec


def _versions() -> dict[str, str]:
    """This machine's Ray and Python versions, which the node's installer is told."""
    pins = versions.node_pins()
    return {f"--ray-version {pins['ray_version']}": "--ray-version <ray>",
            f"--python-version {pins['python_version']}": "--python-version <python>"}


def _lambda_args(case: str) -> tuple[Any, ...]:
    # A hostile owner and key name: values, never keys.
    return ("0123abcd", 'me", provider: {type: aws}, x: "', "us-east-1", "rayfleet-auto-key: yes",
            ["rs-1", "null"], TYPES if case != "conda" else None, 1.0, "10.0.0.5")


@pytest.mark.parametrize("case", sorted(LAMBDA_CASES))
def test_lambda_autoscaler_config(tmp_path: Path, rf_home: Path, case: str) -> None:
    spec = _lambda_spec(tmp_path, case)
    text = autoscale.render_config(spec, *_lambda_args(case))
    config = yaml.safe_load(text)
    assert config["provider"]["owner"] == 'me", provider: {type: aws}, x: "'
    assert config["provider"]["ssh_key_name"] == "rayfleet-auto-key: yes"
    assert config["provider"]["firewall_rulesets"] == ["rs-1", "null"]
    prepared = render.validate_ray_cluster_config(text, case)
    assert prepared["provider"]["type"] == "external"
    assert set(config["available_node_types"]) == {"head", *(spec.worker_types or {})}
    assert_golden(f"lambda/autoscaler-{case}.yaml", text, _versions())
    if case == "full":  # how the head and the workers start Ray (node.sh reads it)
        assert_golden("lambda/autoscaler-full.node.conf", autoscale.node_conf(spec, "i-1", "10.0.0.5"))


@pytest.mark.parametrize("case", sorted(LAMBDA_CASES))
def test_a_lambda_worker_gets_everything_its_commands_run_in_one_file_mount(
        tmp_path: Path, rf_home: Path, case: str) -> None:
    """Ray's updater pays an SSH `mkdir` and an rsync per mount on every worker's way to joining
    (issue 38): the worker kit is the only one, and it holds each script the worker's setup and
    start commands run, as `up` puts the kit on the head."""
    from infra.providers.lambda_cloud import users

    spec = _lambda_spec(tmp_path, case)
    config = yaml.safe_load(autoscale.render_config(spec, *_lambda_args(case)))
    assert config["file_mounts"] == {f"~/{users.WORKER_KIT}": f"~/{users.WORKER_KIT}"}
    conf = autoscale.node_conf(spec, "i-1", "10.0.0.5")
    kit = {f"~/{path}" for path in users.kit_files(b"token", b"password", conf)}
    # node.sh's node.conf and the scripts it runs with `bash` (setup/users/node.sh).
    assert {f"~/{users.WORKER_KIT}/rayfleet/users/{name}"
            for name in ("node.conf", "users.sh", "ray.sh")} <= kit
    if spec.env != "none":
        kit |= {f"~/{path}" for path in autoscale.setup_files(autoscale.KIT_SETUP)}
    # What they run with `bash` (the environment's activate script, sourced, is made by setup).
    words = " ".join(config["worker_setup_commands"] + config["worker_start_ray_commands"]).split()
    scripts = {after.replace('"$HOME"', "~").strip('"')
               for word, after in itertools.pairwise(words) if word == "bash" and ".sh" in after}
    assert scripts and scripts <= kit, scripts - kit
    assert bool(config["worker_setup_commands"]) == (spec.env != "none")


@pytest.mark.parametrize("case", sorted(SLURM_CASES))
def test_slurm_autoscaler_config(tmp_path: Path, case: str) -> None:
    spec = _slurm_spec(tmp_path, case)
    text = slurm_script.autoscaling_config(spec)
    config = render.validate_ray_cluster_config(text, case)
    assert set(config["available_node_types"]) == {slurm_script.HEAD_TYPE, *spec.worker_types}
    assert_golden(f"slurm/autoscaler-{case}.yaml", text)


def test_slurm_labels_and_resource_names_stay_text(tmp_path: Path) -> None:
    config = yaml.safe_load(slurm_script.autoscaling_config(_slurm_spec(tmp_path, "full")))
    gpu = config["available_node_types"]["gpu"]
    assert gpu["labels"] == {"tier": "gpu", "yes": "no", "zone": "0123", "note": "a: b # c",
                             "flow": "{x: [1]}", "empty": ""}
    assert gpu["resources"] == {"CPU": 8, "GPU": 2, "gpu_node": 1, "off": 2}
    assert config["provider"]["worker_types"]["cpu"]["object_store"] == "314572800"

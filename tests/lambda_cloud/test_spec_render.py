"""The lambda spec (strict, one-line errors), the example specs, and the rendered Ray config
(golden files under tests/golden/lambda/, Ray's own validation, no injection)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.cli.loading import load_spec
from infra.core import node_start, paths, privilege, render, versions
from infra.core.errors import SpecError
from infra.providers.lambda_cloud import raycluster
from infra.providers.lambda_cloud.spec import Spec
from tests import node_conf
from tests.conftest import ROOT, assert_spec_keeps_the_file
from tests.forked_cli import run_invoke
from tests.golden import assert_golden

BASE: dict[str, Any] = {
    "provider": "lambda",
    "head": {"choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}]},
    "workers": {"count": 2, "choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}]},
}


def spec_from(tmp_path: Path, name: str = "demo", **changes: Any) -> Spec:
    data = {**BASE, **changes}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    spec = load_spec(path)
    assert isinstance(spec, Spec)
    return spec


@pytest.mark.parametrize(("changes", "message"), [
    ({"worker": {"count": 1}}, "worker: unknown key; did you mean 'workers'?"),
    ({"head": {"choices": []}}, "head.choices: list should have at least 1 item"),
    ({"head": {"choices": [{"instance_type": "gpu_1x_a10", "region": "US East"}]}},
     "head.choices[0].region: string should match pattern"),
    ({"head": {"choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}] * 2}},
     "head.choices: gpu_1x_a10@us-east-1 is listed twice"),
    ({"workers": {"count": 1, "choices": [{"instance_type": "gpu_1x_a10", "region": "us-west-1"}]}},
     "workers.choices: no region in common with head.choices"),
    ({"workers": {"count": 3}}, "workers.choices: workers.count is 3 but no choices are listed"),
    ({"ssh_key_name": "laptop"}, "ssh_key_name and ssh_private_key go together"),
    ({"ssh_key_name": "laptop", "ssh_private_key": "/nonexistent/key"},
     "ssh_private_key: no such file '/nonexistent/key'"),
    ({"ssh_proxy_command": "nc %h %p\nrm -rf /"}, "ssh_proxy_command: must be a single line"),
    ({"env": "cuda"}, "env: input should be 'auto', 'cpu', 'gpu' or 'none'"),
])
def test_bad_specs_are_one_line_errors(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_from(tmp_path, **changes)
    text = str(err.value)
    assert message in text and "\n" not in text, text
    assert "demo.yaml" in text.split(":")[0], text


def test_cli_rejects_a_bad_spec_with_exit_2_and_creates_nothing(tmp_path: Path, rf_home: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, "workers": {"count": 1, "choises": []}}))
    result = run_invoke("up", "--cluster", str(path), env={"LAMBDA_API_URL": "http://127.0.0.1:9/api/v1",
                                                           "LAMBDA_API_KEY": "secret_unused"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "workers.choises: unknown key; did you mean 'choices'?" in lines[0]
    assert not (rf_home / "state").exists() or not list((rf_home / "state").glob("*.json"))
    assert not (rf_home / "keys").exists()


@pytest.mark.parametrize("name", ["lambda", "lambda-minimal"])
def test_example_specs_load_and_render(name: str, rf_home: Path) -> None:
    spec = load_spec(ROOT / "clusters" / f"{name}.yaml")
    assert isinstance(spec, Spec)
    assert_spec_keeps_the_file(spec, ROOT / "clusters" / f"{name}.yaml")
    text = raycluster.render_config(spec, "198.51.100.10", ["198.51.100.11"], Path("/k/id"),
                                    "0123abcd")
    render.validate_ray_cluster_config(text, name)
    # The render is this spec's Ray config on these machines: its name, addresses and key.
    config = yaml.safe_load(text)
    assert config["cluster_name"] == f"{name}-0123abcd"
    assert config["provider"] == {"type": "local", "head_ip": "198.51.100.10",
                                  "worker_ips": ["198.51.100.11"]}
    assert config["min_workers"] == config["max_workers"] == 1
    assert config["auth"] == {"ssh_user": spec.ssh_user, "ssh_private_key": "/k/id"}


def test_every_key_of_the_full_example_is_commented() -> None:
    lines = (ROOT / "clusters" / "lambda.yaml").read_text().splitlines()
    documented = set()
    for i, line in enumerate(lines):
        stripped = line.lstrip("# ").split(":")[0]
        if stripped in Spec.model_fields and i > 0 and lines[i - 1].lstrip().startswith("#"):
            documented.add(stripped)
    assert documented == set(Spec.model_fields) - {"name", "source"}


def _normalise() -> dict[str, str]:
    pins = versions.node_pins()
    return {str(paths.setup_dir()): "<project>/setup", str(paths.home()): "<rayfleet home>",
            f"--ray-version {pins['ray_version']}": "--ray-version <ray>",
            f"--python-version {pins['python_version']}": "--python-version <python>"}


CASES: dict[str, tuple[dict[str, Any], str, list[str]]] = {
    "minimal": ({}, "HEAD_IP_AFTER_LAUNCH", ["WORKER_1_IP_AFTER_LAUNCH", "WORKER_2_IP_AFTER_LAUNCH"]),
    "full": ({"ssh_user": "ubuntu", "env": "gpu", "env_backend": "conda",
              "ssh_proxy_command": "ssh -W %h:%p -i '/keys/bastion key' jump@bastion.example.com",
              "object_store_memory_mb": 2048},
             "198.51.100.10", ["198.51.100.11", "198.51.100.12"]),
    "env-none": ({"env": "none", "workers": {"count": 0}}, "198.51.100.10", []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_config_matches_golden(tmp_path: Path, case: str) -> None:
    changes, head, workers = CASES[case]
    spec = spec_from(tmp_path, **changes)
    key = Path("/home/me/.rayfleet/keys/demo/id_ed25519")
    text = raycluster.render_config(spec, head, workers, key, "0123abcd")
    again = raycluster.render_config(spec, head, workers, key, "0123abcd")
    assert again == text, "rendering is deterministic"
    prepared = render.validate_ray_cluster_config(text, case)
    assert prepared["provider"] == {"type": "local", "head_ip": head, "worker_ips": workers}
    config = yaml.safe_load(text)
    assert config["max_workers"] == config["min_workers"] == len(workers)
    assert config["auth"].get("ssh_proxy_command") == spec.ssh_proxy_command
    # The start lines name node.sh; the node.conf beside it says what it runs: users first, then
    # `ray stop`, then Ray as its unprivileged user without a monitor (the autoscaler's user
    # starts Ray's monitor after `ray up`, supervised, once the node package that holds the
    # supervisor is on the head: remote_head.start_ray_up_monitor).
    assert config["head_start_ray_commands"] == [node_start.command("head")]
    assert config["worker_start_ray_commands"] == [node_start.command("worker")]
    assert config["file_mounts"][f"~/{privilege.USERS_DIR}"] == str(
        paths.rendered_dir(spec.name) / node_start.STAGED)
    assert "ray.autoscaler" not in text
    monitor = privilege.ray_up_monitor(6379, spec.auth == "token", "rayfleet/node/x.zip")
    assert "infra.node.supervise ensure" in monitor
    conf = raycluster.node_conf(spec, "10.0.0.5")
    flags = {role: node_conf.array(conf, f"{role}_flags") for role in ("head", "worker")}
    assert "--dashboard-host=127.0.0.1" in flags["head"] and "--no-monitor" in flags["head"]
    assert f"--address={node_conf.HEAD_IP}:6379" in flags["worker"]
    assert all("RAY_USAGE_STATS_ENABLED=0" in node_conf.words(conf, r) for r in ("head", "worker"))
    assert "runuser -u rayfleet-scaler" in monitor and "ray.autoscaler._private.monitor" in monitor
    assert "scaler:ray_bootstrap_key.pem" in node_conf.array(conf, "head_files")
    assert not any(f.startswith("scaler:") for f in node_conf.array(conf, "worker_files"))
    assert "PRIVATE KEY" not in text
    if case == "full":  # how its nodes start Ray (node.sh reads it)
        assert_golden("lambda/full.node.conf", conf, _normalise())
    assert_golden(f"lambda/{case}.yaml", text, _normalise())


def test_hostile_values_stay_values(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, ssh_proxy_command='nc %h %p"}, provider: {type: aws}, x: {"')
    config = yaml.safe_load(raycluster.render_config(spec, "h", [], Path("/k"), "0123abcd"))
    assert config["auth"]["ssh_proxy_command"] == spec.ssh_proxy_command
    assert config["provider"]["type"] == "local"


def test_plan_renders_a_running_clusters_autoscaler_config_as_up_did(rf_home: Path) -> None:
    """`plan` passes no head: it renders from the state, which records the head, so that for a
    running cluster whose spec did not change its config equals what `up` rendered (with the
    head's address and region, not a placeholder) and plan reports no change."""
    from infra.core import state as state_mod
    from infra.node.lambda_cloud import api
    from infra.providers.lambda_cloud import autoscale, planning
    from infra.providers.lambda_cloud.records import Firewall, Instance, SshKey

    spec = load_spec(ROOT / "clusters" / "lambda-autoscale.yaml")
    assert isinstance(spec, Spec) and spec.autoscaling
    region = "us-west-1"  # where the head landed: not the first choice's region
    current = state_mod.State.new(state_mod.state_path(spec.name), spec.name, "lambda")
    current.add("k1", SshKey(name=f"rayfleet-{spec.name}-0123abcd-ff00"))
    current.add("fw1", Firewall(name="rs", region=region))
    head = api.Instance("i-head", f"{spec.name}-0123abcd-head", "active", "198.51.100.10",
                        "10.0.0.5", spec.head.choices[-1].instance_type, region, 110)
    current.add(head.id, Instance(name=head.name, instance_type=head.type_name,
                                  region=region, price_cents_per_hour=110, slot="head",
                                  ip=head.ip, private_ip=head.private_ip, status="active"))
    at_up = planning.render_autoscaler(spec, current, head, None, 1.0)
    at_plan = planning.render_autoscaler(spec, current, None, None, 1.0)
    assert at_plan == at_up
    # The nodes' start (node.conf, SFTP'd by `up`) joins them at the head's private address.
    assert "RAY_ADDRESS=10.0.0.5:" in autoscale.node_conf(spec, head.id, head.private_ip)
    # Before any head exists: the placeholder, as before.
    assert raycluster.HEAD_PRIVATE_IP_PLACEHOLDER in autoscale.node_conf(spec, "i-1", None)


def test_the_heads_autoscaler_loops_every_second(tmp_path: Path) -> None:
    """Ray's default loop (5 s) would add 2.5 s on average between a job's demand and its first
    launch; the benches and the test bed measured with a 1 s loop, so the product has it too."""
    from infra.providers.lambda_cloud import autoscale

    spec = load_spec(ROOT / "clusters" / "lambda-autoscale.yaml")
    assert isinstance(spec, Spec)
    command = autoscale.monitor_command(spec, "10.0.0.2")
    assert "AUTOSCALER_UPDATE_INTERVAL_S=1" in command, command

"""Slurm spec validation and the batch script: golden files, shellcheck, invariants (no Slurm needed)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.cli import loading
from infra.core import render, shipping
from infra.core.errors import SpecError
from infra.node import rayproc
from infra.node.slurm import node_helper
from infra.providers.slurm import script as slurm_script
from infra.providers.slurm.script import autoscaling_config, render_script
from infra.providers.slurm.spec import Spec
from tests.conftest import ROOT, assert_spec_keeps_the_file
from tests.forked_cli import run_invoke
from tests.golden import assert_golden
from tests.slurm import nodezip

BASE = "provider: slurm\ncpus_per_node: 2\n"

BAD_SPECS = [
    ("cpus_per_node: 0\n", "cpus_per_node: input should be greater than or equal to 1"),
    ("cpus_per_node: 2\nnodes: 0\n", "nodes: input should be greater than or equal to 1"),
    ("nodes: 2\n", "cpus_per_node: required key is missing"),
    ("cpus_per_node: 2\ntime_limit: soon\n", "time_limit: 'soon' is not a Slurm time"),
    ("cpus_per_node: 2\ntime_limit: '0:30'\n", "under a minute"),
    ("cpus_per_node: 2\npartiton: gpu\n", "did you mean 'partition'?"),
    ("cpus_per_node: 2\npartition: 'gpu; rm -rf /'\n", "partition: string should match pattern"),
    ("cpus_per_node: 2\nsubmit: {user: alice}\n", "user is only used with a login host"),
    ("cpus_per_node: 2\nsubmit: {host: login, jump_host: a@b, proxy_command: nc %h %p}\n",
     "jump_host and proxy_command exclude each other"),
    ("cpus_per_node: 2\nsubmit: {hots: login}\n", "submit.hots: unknown key; did you mean 'host'?"),
    ("cpus_per_node: 2\ngpu_type: a100\n", "gpu_type: a GPU type needs gpus_per_node"),
    ("cpus_per_node: 2\ngpu_workers: {nodes: 1}\n", "gpu_workers.cpus_per_node: required key"),
    ("cpus_per_node: 2\ngpu_workers: {cpus_per_node: 0}\n",
     "gpu_workers.cpus_per_node: input should be greater than or equal to 1"),
    ("cpus_per_node: 2\nport_range_start: 60000\n", "past 65535"),
    ("cpus_per_node: 2\nextra_sbatch_options: ['--mail-type=END --x']\n", "one long sbatch option"),
    ("cpus_per_node: 2\nextra_sbatch_options: ['--nodes=3']\n", "is set by rayfleet"),
    ("cpus_per_node: 2\nenvironment: {env_vars: {RF_BASE: '1'}}\n", "set by the job itself"),
    ("cpus_per_node: 2\nenvironment: {modules: ['a b']}\n", "is not a module name"),
    ("cpus_per_node: 2\nray_temp_root: /very/long/temp/root/that/breaks/sockets\n",
     "ray_temp_root: string should match pattern"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_SPECS)
def test_bad_slurm_spec_is_one_line_naming_the_field(tmp_path: Path, text: str,
                                                     expected: str) -> None:
    path = tmp_path / "hpc.yaml"
    path.write_text("provider: slurm\n" + text)
    with pytest.raises(SpecError) as caught:
        loading.load_spec(path)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_zero_cpus_through_invoke_exits_2_and_creates_nothing(tmp_path: Path,
                                                              rf_home: Path) -> None:
    path = tmp_path / "hpc.yaml"
    path.write_text("provider: slurm\ncpus_per_node: 0\n")
    done = run_invoke("up", "--cluster", str(path))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cpus_per_node: input should be greater than or equal to 1" in lines[0]
    assert not (rf_home / "state").exists() or not any((rf_home / "state").glob("*.json"))


@pytest.mark.parametrize("name", ["slurm.yaml", "slurm-minimal.yaml", "slurm-login.yaml",
                                  "slurm-gpu.yaml"])
def test_example_specs_load(name: str) -> None:
    loaded = loading.load_spec(ROOT / "clusters" / name)
    assert isinstance(loaded, Spec)
    assert_spec_keeps_the_file(loaded, ROOT / "clusters" / name)


def test_full_example_has_a_comment_for_every_key() -> None:
    text = (ROOT / "clusters" / "slurm.yaml").read_text().splitlines()
    keys = [(i, line) for i, line in enumerate(text)
            if re.match(r"^\s*#?\s*[a-z_]+:", line) and not line.lstrip("# ").startswith("e.g.")]
    for i, line in keys:
        above = text[i - 1].strip()
        assert above.startswith("#") and not re.match(r"^#\s*[a-z_]+:", above.lstrip("# ")), (
            f"clusters/slurm.yaml line {i + 1} ({line.strip()}) has no comment sentence above it")
    # Every field of the spec appears in the full example.
    for field in [*Spec.model_fields, *Spec.model_fields["submit"].annotation.model_fields]:  # type: ignore[union-attr]
        if field not in ("name", "source"):
            assert re.search(rf"^\s*#?\s*{field}:", "\n".join(text), re.M), field


CASES = {
    "single": BASE + "object_store_memory_mb: 100\n",
    "multi": BASE + "nodes: 3\npartition: debug\naccount: proj\ntime_limit: '2:00:00'\n"
                    "memory_per_node_mb: 4000\nexclusive: true\nresources: {cpu_node: 1}\n"
                    "extra_sbatch_options: [--mail-type=END]\n",
    "hetero": BASE + "nodes: 1\npartition: cpu\ngpus_per_node: 0\nobject_store_memory_mb: 500\n"
                     "gpu_workers: {nodes: 2, partition: gpu, cpus_per_node: 8, gpus_per_node: 4,"
                     " gpu_type: a100, memory_per_node_mb: 64000, resources: {gpu_node: 1}}\n",
    "environment": BASE + "environment: {modules: [python/3.11, cuda/12.1], activate: "
                          "~/envs/ray, env_vars: {OMP_NUM_THREADS: '1', NOTE: \"it's $HOME\"}}\n"
                          "ray_temp_root: /scratch/tmp\nport_range_start: 24000\nport_blocks: 10\n",
    "autoscale": BASE + "partition: cpu\ntime_limit: '4:00:00'\nidle_timeout_minutes: 2\n"
                        "worker_types:\n  cpu: {cpus_per_node: 4, max_workers: 3}\n"
                        "  gpu: {partition: gpu, cpus_per_node: 8, gpus_per_node: 2, "
                        "gpu_type: a100, memory_per_node_mb: 64000, time_limit: '1:00:00', "
                        "min_workers: 1, max_workers: 2, resources: {gpu_node: 1}, "
                        "labels: {tier: gpu}}\n",
    # The idle watcher beside the head: a fixed cluster and an autoscaling one.
    "autodown": BASE + "nodes: 2\nautodown: {idle_minutes: 30}\n",
    "autodown-autoscale": BASE + "autodown: {idle_minutes: 0.5}\n"
                                 "worker_types:\n  cpu: {cpus_per_node: 4, max_workers: 3}\n",
    "tracking": BASE + "tracking: mlflow\n"
                       "worker_types:\n  cpu: {cpus_per_node: 4, max_workers: 3}\n",
    # The sharing gateway beside the head, from the config `up` puts on the shared work dir.
    "sharing": BASE + "sharing: {port: 8443, members_run_as_owner: true}\n",
}


def _spec(tmp_path: Path, case: str) -> Spec:
    path = tmp_path / f"{case}.yaml"
    path.write_text(CASES[case])
    loaded = loading.load_spec(path)
    assert isinstance(loaded, Spec)
    return loaded


def _render(tmp_path: Path, case: str) -> str:
    return render_script(_spec(tmp_path, case))


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_script_matches_golden(tmp_path: Path, case: str) -> None:
    script = _render(tmp_path, case)
    # Every node runs its helper from the node package the script carries (our own modules,
    # tested where they live); its bytes and name change with every edit of them.
    parts = shipping.node_zip_parts(slurm_script.NODE_PACKAGES)
    assert all(part in script for part in parts)
    assert "-m infra.node.slurm.node_helper" in script
    shipped = {part: f"<node package zip, base64, piece {n}>" for n, part in enumerate(parts)}
    shipped[shipping.zip_name(slurm_script.NODE_PACKAGES)] = "<node package zip name>"
    assert_golden(f"slurm/{case}.sbatch", script, shipped)


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_script_is_valid_and_shellcheck_clean(tmp_path: Path, case: str) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(_render(tmp_path, case))
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    # The node package's ~2,500 base64 lines are data in quoted heredocs, nothing shellcheck reads
    # as shell, yet half its CPU per script: it lints the script with one line of them.
    linted = tmp_path / "job-lint.sbatch"
    linted.write_text(re.sub(r"(<<'RAYFLEET_ZIP_END'\n).*?(\nRAYFLEET_ZIP_END\n)", r"\1UEsDBA==\2",
                             script.read_text(), flags=re.S))
    lint = subprocess.run(["shellcheck", "-s", "bash", str(linted)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_script_invariants(tmp_path: Path, case: str) -> None:
    script = _render(tmp_path, case)
    assert script == _render(tmp_path, case), "rendering must be deterministic"
    zipped = shipping.node_zip_base64(slurm_script.NODE_PACKAGES)
    script = script.replace(zipped, "<node package zip, base64>")
    # No fixed waits: every sleep is a short poll interval (but the restart delay of a failed
    # head daemon's supervisor, rf_supervised, and the gateway's backing-off wait for the config
    # `up` writes, both after start-up).
    startup = re.sub(r"until PYTHONPATH=.*?\n *done\n", "", script, flags=re.S)
    startup = re.sub(r"\nrf_gateway\(\) \{.*?\n\}\n", "\n", startup, flags=re.S)
    assert set(re.findall(r"\bsleep\s+([\d.]+)", startup)) <= {"0.1"}
    assert "export RAY_USAGE_STATS_ENABLED=0" in script
    assert "export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0" in script
    assert "ray stop" not in script
    head = script[script.index("args=(--head"):]
    head = head[:head.index("\n  )")]
    # The dashboard and job API on the head's loopback only (reached through an SSH tunnel).
    assert "--dashboard-host=127.0.0.1" in head and "RF_HEAD_IP\" --include" not in head
    # Token auth on every node, from a file whose path (never the token) is in the script.
    assert "export RAY_AUTH_MODE=token" in script
    assert "RAY_AUTH_TOKEN_PATH=$SLURM_SUBMIT_DIR/keys/$RF_CLUSTER_ID/ray-token" in script
    # Private temp dirs: mktemp, never a predictable path.
    assert 'mktemp -d "$RF_TEMP_ROOT/rf-$RF_CLUSTER_ID.$1.XXXXXX"' in script
    assert "mkdir -p \"$temp\"" not in script and "RF_TEMP_PREFIX" not in script
    workers = [script]
    if "worker_types" in CASES[case]:
        workers = [script[script.index("cat > \"$RF_HEAD_TEMP/worker.sbatch\""):]]
    else:
        assert "--no-monitor" in script
    for flag in rayproc.PortBlock(0).flags():
        name, offset = flag.split("=")
        assert f"{name}=$((RF_BASE + {offset}))" in head
        for text in workers:
            worker = text[text.index("args=(--address="):]
            ends = [i for i in (worker.find("\n  )"), worker.find("--temp-dir")) if i > 0]
            worker = worker[:min(ends)]
            # Every node's own block, checked free on that node (`helper block`).
            if name not in ("--port", "--dashboard-port", "--ray-client-server-port"):
                assert f"{name}=$((base + {offset}))" in worker
            else:
                assert name + "=" not in worker
    assert ("#SBATCH hetjob" in script) == (case == "hetero")
    assert ("--het-group" in script) == (case == "hetero")
    # The gateway only with sharing:, from a copy in the head's private dir (so that the job's
    # end stops it), never from the shared folder `up` writes, and ended by the trap.
    assert ("infra.node.gateway" in script) == (case == "sharing")
    if case == "sharing":
        assert 'rf_supervised "$RF_HEAD_TEMP/rayfleet-gateway.json" infra.node.gateway' in script
        assert 'kill -TERM "$RF_GATEWAY"' in script
        # A previous job's config is void before this job can be ready.
        assert script.index('rm -f "$RF_GATEWAY_SHARED"') < script.index("rf_helper prepare")


def test_autoscaling_config_passes_rays_checks_and_ships_what_the_head_imports(
        tmp_path: Path) -> None:
    path = tmp_path / "autoscale.yaml"
    path.write_text(CASES["autoscale"])
    loaded = loading.load_spec(path)
    assert isinstance(loaded, Spec)
    text = autoscaling_config(loaded)
    config = render.validate_ray_cluster_config(text, "autoscaling.yaml")
    assert config["provider"]["disable_node_updaters"] is True
    assert config["provider"]["module"] == "infra.node.slurm.node_provider.SlurmNodeProvider"
    assert config["idle_timeout_minutes"] == 2 and config["max_workers"] == 5
    gpu = config["available_node_types"]["gpu"]
    assert gpu["resources"] == {"CPU": 8, "GPU": 2, "gpu_node": 1} and gpu["min_workers"] == 1
    options = config["provider"]["worker_types"]["gpu"]
    assert "--partition=gpu" in options["sbatch"] and "--gres=gpu:a100:2" in options["sbatch"]
    assert options["time_limit_s"] == 3600
    assert config["provider"]["worker_types"]["cpu"]["time_limit_s"] == 4 * 3600
    script = render_script(loaded)
    # Slurm's part of the node package, node provider included.
    assert all(part in script for part in shipping.node_zip_parts(slurm_script.NODE_PACKAGES))
    assert "RAY_enable_autoscaler_v2=1" in script and "--autoscaling-config=" in script
    # The head writes the config as rendered here: nothing on the head changes it.
    assert text.strip() in script and "autoscaling.source" not in script


def test_the_node_provider_takes_the_running_jobs_facts_from_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's monitor builds our node provider from the config rendered on the laptop, unchanged;
    what only the head's job knows comes from the environment the batch script exports."""
    import yaml

    from infra.node.slurm.node_provider import Runtime, SlurmNodeProvider
    from infra.node.slurm.queue import SlurmError

    path = tmp_path / "autoscale.yaml"
    path.write_text(CASES["autoscale"])
    loaded = loading.load_spec(path)
    assert isinstance(loaded, Spec)
    config = yaml.safe_load(autoscaling_config(loaded))
    env = {"RF_BASE": "20128", "RF_GCS_PORT": "20129", "RF_HEAD_IP": "10.0.0.5",
           "RF_JOB_ID": "42", "RF_CLUSTER_ID": "0a1b2c3d", "RF_OWNER": "abcdefabcdef",
           "SLURM_SUBMIT_DIR": "/w", "RF_HEAD_TEMP": "/tmp/rf-0a1b2c3d.0.XYZ"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    provider = SlurmNodeProvider(config["provider"], config["cluster_name"])
    assert provider.runtime == Runtime(
        cluster_id="0a1b2c3d", owner="abcdefabcdef", head_job_id="42", head_ip="10.0.0.5",
        gcs_port=20129, port_base=20128, submit_dir="/w",
        worker_script="/tmp/rf-0a1b2c3d.0.XYZ/worker.sbatch")
    assert provider.internal_ip("42") == "10.0.0.5"
    # Started other than by the batch script: one line naming what is missing.
    monkeypatch.delenv("RF_JOB_ID")
    monkeypatch.delenv("RF_GCS_PORT")
    with pytest.raises(SlurmError, match=r"lacks RF_JOB_ID, RF_GCS_PORT: .*invoke up"):
        SlurmNodeProvider(config["provider"], config["cluster_name"])


@pytest.mark.parametrize(("case", "modules"), [
    ("autoscale", ["infra.node.slurm.node_provider"]),
    ("autodown", ["infra.node.autodown", "infra.node.slurm.autodown"]),
    ("autodown-autoscale", ["infra.node.slurm.node_provider", "infra.node.autodown",
                            "infra.node.slurm.autodown"]),
])
def test_head_side_modules_import_with_ray_and_the_shipped_files_only(
        tmp_path: Path, case: str, modules: list[str]) -> None:
    # What the head has: Ray and the zip the batch script writes (what the zip's modules may
    # import is tests/node/test_node_package.py's rule). The node provider for Ray's monitor, the idle
    # watcher and Slurm's removal action for autodown.
    shipped = tmp_path / "py"
    shipped.mkdir()
    script = tmp_path / "job.sbatch"
    script.write_text(render_script(_spec(tmp_path, case)))
    # The script's own lines write the zip (as on the head), nothing else of it runs.
    block = re.search(r"^RF_NODE_ZIP_0=.*?^export -f rf_unpack rf_helper$", script.read_text(),
                      re.M | re.S)
    assert block is not None
    # From a file, as sbatch runs it: the block as one argument would pass MAX_ARG_STRLEN.
    lines = tmp_path / "unpack.sh"
    lines.write_text(block.group(0) + '\nrf_unpack "$RF_ZIP_DIR"\n')
    written = subprocess.run(["bash", str(lines)], env={
        "PATH": "/usr/bin:/bin", "RF_ZIP_DIR": str(shipped)}, capture_output=True, text=True)
    assert written.returncode == 0, written.stderr
    (archive,) = shipped.glob("rayfleet-node-*.zip")
    shipped = archive
    probe = ("import sys, importlib;"
             f"[importlib.import_module(m) for m in {modules!r}];"
             "from infra.node.autodown import Config; import infra.node.slurm.autodown as a;"
             "import infra; print(infra.__file__)")
    if case == "autoscale":
        probe = probe.replace("from infra.node.autodown import Config; import "
                              "infra.node.slurm.autodown as a;", "")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shipped)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(shipped)), done.stdout


def test_the_helper_writes_a_watcher_config_the_watcher_reads(tmp_path: Path) -> None:
    from infra.node import autodown

    env = {"RF_HEAD_TEMP": str(tmp_path), "RF_BASE": "20000", "RF_CLUSTER_ID": "0123abcd",
           "RF_JOB_ID": "42", "SLURM_SUBMIT_DIR": "/home/u/jobs", "SLURM_JOB_NAME": "rf-c-x-h1",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/home/u/jobs/keys/0123abcd/ray-token",
           "PATH": "/usr/bin:/bin"}
    target = tmp_path / "autodown.json"
    done = nodezip.helper("autodown-config", str(target), "0.5", "c", base=env)
    assert done.returncode == 0, done.stderr
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    config = autodown.Config.load(target)
    assert config.idle_minutes == 0.5 and config.cluster_id == "0123abcd"
    assert config.dashboard_url == f"http://127.0.0.1:{rayproc.PortBlock(20000).dashboard}"
    assert config.marker == str(tmp_path / "autodown-marker.json")
    assert config.action == "infra.node.slurm.autodown:remove"
    assert config.action_args["record"] == "/home/u/jobs/rf-c-x-h1.autodown.json"
    assert config.action_args["head_job_id"] == "42"
    assert config.token_path == env["RAY_AUTH_TOKEN_PATH"]


def test_autoscaling_spec_rules(tmp_path: Path) -> None:
    for text, expected in [
        ("nodes: 2\nworker_types: {cpu: {cpus_per_node: 1}}\n", "head as a one-node job"),
        ("worker_types: {cpu: {cpus_per_node: 1, min_workers: 3, max_workers: 2}}\n",
         "min_workers (3) is above max_workers (2)"),
        ("worker_types: {CPU: {cpus_per_node: 1}}\n", "a worker type name is"),
        ("worker_types: {cpu: {cpus_per_node: 1, time_limit: soon}}\n", "is not a Slurm time"),
        ("gpu_workers: {cpus_per_node: 1}\nworker_types: {cpu: {cpus_per_node: 1}}\n",
         "exclude each other"),
    ]:
        path = tmp_path / "bad.yaml"
        path.write_text(BASE + text)
        with pytest.raises(SpecError) as caught:
            loading.load_spec(path)
        assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_hostile_environment_values_stay_data(tmp_path: Path) -> None:
    script = _render(tmp_path, "environment")
    exports = [line for line in script.splitlines() if line.startswith("export NOTE=")]
    assert len(exports) == 1
    out = subprocess.run(["bash", "-c", f"{exports[0]}; printf %s \"$NOTE\""],
                         capture_output=True, text=True)
    assert out.stdout == "it's $HOME"
    assert 'rf_env="$HOME"/envs/ray' in script


def test_every_node_finds_the_tracking_server_and_reads_its_password_from_the_file(
        tmp_path: Path) -> None:
    from infra.node import tracking as node_tracking

    script = _render(tmp_path, "tracking")
    worker_sh = script[script.index('cat > "$RF_HEAD_TEMP/worker.sbatch"'):]
    worker_sh = worker_sh[:worker_sh.index("RAYFLEET_WORKER_END\n")]
    head = script.replace(worker_sh, "")
    node_sh = head[head.index("read -r -d '' RF_NODE_SH"):head.index("RAYFLEET_NODE_END\n\n")]
    offset = rayproc.PortBlock(0).tracking
    for part in (head, worker_sh):
        # Defined once per batch script, for every node's shell (fixed and autoscaled workers).
        assert 'export MLFLOW_TRACKING_URI="http://$RF_HEAD_IP:$((RF_BASE + ' f'{offset}))"' in part
        assert 'export MLFLOW_TRACKING_USERNAME="rayfleet"' in part
        assert 'file="$SLURM_SUBMIT_DIR/keys/$RF_CLUSTER_ID/mlflow-password"' in part
        assert 'MLFLOW_TRACKING_PASSWORD=$(<"$file")' in part
        assert "export -f rf_tracking_env" in part
    # ...and set right before each node's `ray start`, on the head and on every worker.
    for shell in (node_sh, worker_sh):
        call = shell.index("rf_tracking_env || exit 1")
        assert call < shell.index('rf_helper start')
    # The server: after Ray is ready, on the head's address, its store per cluster on the
    # shared work dir, its secrets by path.
    ready = head.index('rf_helper await "$RF_INFO"')
    # (under the head daemons' supervisor: rf_supervised CONFIG MODULE)
    start = head.index('rf_supervised "$RF_HEAD_TEMP/rayfleet-tracking.json" infra.node.tracking &')
    assert ready < start
    assert ('rf_helper tracking-config "$RF_HEAD_TEMP/rayfleet-tracking.json" '
            '"$SLURM_SUBMIT_DIR/tracking/"tracking '
            '"$SLURM_SUBMIT_DIR/keys/$RF_CLUSTER_ID/mlflow-password" '
            '"$SLURM_SUBMIT_DIR/keys/$RF_CLUSTER_ID/mlflow-flask-secret"') in " ".join(
                head.replace("\\\n", " ").split())  # as bash reads its continued lines
    assert 'kill -TERM "$RF_TRACKER"' in head
    assert node_tracking.CONFIG_FILE == "rayfleet-tracking.json"
    # Nothing of it without `tracking: mlflow`.
    assert "MLFLOW" not in _render(tmp_path, "autodown-autoscale")


def test_the_tracking_config_the_head_writes_is_what_the_supervisor_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.node import tracking as node_tracking

    monkeypatch.setenv("RF_HEAD_IP", "10.1.2.3")
    monkeypatch.setenv("RF_BASE", "23000")
    store = tmp_path / "work" / "tracking" / "duo"
    target = tmp_path / "head" / node_tracking.CONFIG_FILE
    target.parent.mkdir()
    assert node_helper.tracking_config(str(target), str(store), "/k/mlflow-password",
                                       "/k/mlflow-flask-secret") == 0
    data = json.loads(target.read_text())
    config = node_tracking.ServerConfig(**data)  # every field, nothing more
    assert (config.host, config.port) == ("10.1.2.3", rayproc.PortBlock(23000).tracking)
    assert config.store_dir == str(store) and config.password_path == "/k/mlflow-password"
    assert store.stat().st_mode & 0o777 == 0o700 and target.stat().st_mode & 0o777 == 0o600


def test_without_mlflow_on_the_nodes_the_head_says_so_and_starts_no_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    monkeypatch.setenv("RF_HEAD_IP", "10.1.2.3")
    monkeypatch.setenv("RF_BASE", "23000")
    target = tmp_path / "rayfleet-tracking.json"
    assert node_helper.tracking_config(str(target), str(tmp_path / "store"), "/k/p", "/k/s") == 1
    assert "tracking: mlflow needs MLflow where Ray runs" in capsys.readouterr().err
    assert not target.exists() and not (tmp_path / "store").exists()


def test_the_node_zip_fits_in_environment_strings() -> None:
    """`srun` hands the zip to every worker step in RF_NODE_ZIP_<n>, and Linux refuses to start a
    program with an environment string over 128 KiB (MAX_ARG_STRLEN): past that, every
    multi-node job would fail to start its workers. So the zip goes in pieces, each under it,
    that decode to the zip once joined."""
    parts = shipping.node_zip_parts(slurm_script.NODE_PACKAGES)
    for n, part in enumerate(parts):
        entry = f"RF_NODE_ZIP_{n}={part}"
        assert len(entry.encode()) < 32 * 4096, f"piece {n}: {len(entry)} bytes"
    joined = base64.b64decode("".join(parts).replace("\n", ""))
    assert joined == shipping.node_zip(slurm_script.NODE_PACKAGES)
    assert "\n".join(parts) == shipping.node_zip_base64(slurm_script.NODE_PACKAGES)

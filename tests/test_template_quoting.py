"""Every template, rendered with hostile strings where validation would have stopped them.

Each template is rendered first as a provider renders it (a valid spec with every branch on), and
the variables it was given are recorded. Then each value of that context (every string, number,
and dict key, one at a time) is replaced by a hostile string: `$(...)`, backticks, both quotes,
`;` and a newline. Either the render refuses (a filter that checks what it
prints: nothing is written, nothing runs), or its output must still parse (`bash -n`, or YAML with
the same top-level keys) and, run, must not run the injected command: shell outputs run whole and
every shell command in a YAML output runs under `bash -c`, all with stub `ray`, Slurm and `python`
commands first on the PATH, in a private HOME. The injected command would create a file; it must
never exist.

Values of type `render.Shell` are shell text our own code built from quoted parts (e.g. Lambda's
`activate` prefix): they are code, not data, and are left as they are.
"""

from __future__ import annotations

import copy
import secrets
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import providers
from infra.cli import loading
from infra.core import paths, render
from infra.providers.lambda_cloud import autoscale, raycluster
from infra.providers.lambda_cloud.spec import Spec as LambdaSpec
from infra.providers.lambda_cloud.users import WORKER_KIT
from infra.providers.slurm import script
from infra.providers.slurm.spec import Spec as SlurmSpec
from tests.conftest import ROOT
from tests.gcp_tpu.conftest import write_spec as write_gcp_spec

#: Rendered only through `{% include %}` from the sbatch templates.
INCLUDED = {"slurm.environment.j2"}
#: Ray configs that start nothing themselves (Slurm's autoscaler: the worker's batch job does).
NO_COMMANDS = {"slurm.autoscaler.yaml.j2"}

STUBS = {
    # What a node would run: each stub records its arguments and does nothing else.
    "ray": "",
    "python": "",
    "python3": "",
    "srun": "",
    "sbatch": "",
    "squeue": "",
    "scancel": "",
    "module": "",
    "base64": "cat >/dev/null",
    "scontrol": 'case "$2" in hostnames) echo n1 ;; *) echo NodeAddr=127.0.0.1 ;; esac',
    # Lambda's nodes run Ray as its own user (infra/core/privilege.py): here, as whoever runs the test.
    "runuser": 'while [ "$#" -gt 0 ] && [ "$1" != -- ]; do shift; done; shift; exec "$@"',
    "sudo": 'while [ "${1#-}" != "$1" ]; do shift; done; exec "$@"',
}

Leaf = tuple[Any, ...]


def _hostile(marker: Path) -> str:
    """Balanced quotes, so that a value pasted raw parses and runs (the run must catch it)."""
    return f"a'b'\"c\" $(touch {marker}) `touch {marker}`; touch {marker}\ntouch {marker} #"


def _leaves(value: Any, path: Leaf = ()) -> Iterator[Leaf]:
    """Paths to every string, number and dict key in a context (Shell values are code)."""
    if isinstance(value, render.Shell):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, ("key", key))
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        yield path


def _replaced(value: Any, path: Leaf, new: str) -> Any:
    """A copy of `value` with the leaf at `path` replaced by `new`."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(head, tuple) and head[0] == "key" and not rest:
        return {(new if k == head[1] else k): v for k, v in value.items()}
    if isinstance(value, dict):
        return {k: (_replaced(v, rest, new) if k == head else v) for k, v in value.items()}
    items = [(_replaced(v, rest, new) if i == head else v) for i, v in enumerate(value)]
    return tuple(items) if isinstance(value, tuple) else items


class Bed:
    """A private HOME, submit dir and PATH of stubs where rendered scripts run harmlessly."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.marker = root / "INJECTED"
        self.stubs = root / "stubs"
        self.stubs.mkdir(parents=True)
        for name, body in STUBS.items():
            stub = self.stubs / name
            stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{root}/calls.log"\n{body}\n')
            stub.chmod(0o755)
        self.home = root / "home"
        # The node env a setup command made (Lambda's commands source it before `ray`).
        (self.home / "rayfleet" / "env").mkdir(parents=True)
        (self.home / "rayfleet" / "env" / "rayfleet-activate.sh").write_text("")
        # The users installer the head received (setup/users/users.sh), and the one in the kit an
        # autoscaled Lambda worker receives (users.WORKER_KIT): recorded, never run here.
        self.users = [folder / "rayfleet" / "users" for folder in (self.home, self.home / WORKER_KIT)]
        for users in self.users:
            users.mkdir(parents=True)
            for name in ("users.sh", "guard.sh", "gcp_tpu_env.sh"):
                (users / name).write_text(f'echo "{name} $*" >> "{root}/calls.log"\n')
            # Ray's start and stop as the node runs them: the real scripts (node.sh reads the
            # cluster's node.conf beside it), which end in the stubs (runuser, sudo, ray).
            for name in ("node.sh", "ray.sh"):
                shutil.copy(ROOT / "setup" / "users" / name, users)
        (self.home / ".rayfleet").mkdir()
        self.work = root / "work"
        self.work.mkdir()
        self.cluster_id = secrets.token_hex(4)
        # What the batch script checks before it starts: the token and password files, 0600.
        self.submit = root / "submit"
        keys = self.submit / "keys" / self.cluster_id
        keys.mkdir(parents=True)
        for name in ("ray-token", "mlflow-password"):
            (keys / name).write_text("x")
            (keys / name).chmod(stat.S_IRUSR | stat.S_IWUSR)

    def conf(self, text: str) -> None:
        """node.conf beside each node.sh (the start lines of the YAML configs run those)."""
        for users in self.users:
            (users / "node.conf").write_text(text)

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.stubs}:/usr/bin:/bin", "HOME": str(self.home), "LANG": "C",
                "SLURM_SUBMIT_DIR": str(self.submit), "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NAME": "rf-job", "SLURM_JOB_NODELIST": "n1",
                "RF_CLUSTER_ID": self.cluster_id, "RAY_HEAD_IP": "127.0.0.1",
                # What the head's node provider passes an autoscaled worker's batch script.
                "RF_HEAD_IP": "127.0.0.1", "RF_BASE": "20000", "RF_GCS_PORT": "20001",
                "RF_NODE_TYPE": "cpu", "RF_CPUS": "1", "RF_GPUS": "0", "RF_OBJECT_STORE": "",
                "RF_RESOURCES": "{}", "RF_LABELS": "{}"}

    def run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, env=self.env(), cwd=self.work, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    def cleanup(self) -> None:
        # The batch scripts' private dirs (mktemp under the spec's ray_temp_root, /tmp).
        for leftover in Path("/tmp").glob(f"rf-{self.cluster_id}.*"):
            shutil.rmtree(leftover, ignore_errors=True)


def _commands(config: dict[str, Any]) -> list[str]:
    """Every shell command in a Ray cluster YAML (top level and per node type)."""
    found: list[str] = []
    for scope in [config, *(config.get("available_node_types") or {}).values()]:
        for key, value in scope.items():
            if key.endswith("_commands") and isinstance(value, list):
                found += [str(c) for c in value]
    return found


def _check(template: str, text: str, baseline_keys: set[str] | None, bed: Bed, what: str) -> None:
    """Parse `text` and run its shell harmlessly; the marker file must not appear."""
    if template == "node.conf.j2":
        # node.sh with this node.conf, as a head and as a worker start with it.
        bed.conf(text)
        for role in ("head", "worker"):
            syntax = bed.run(["bash", "-n", str(bed.users[0] / "node.conf")])
            assert syntax.returncode == 0, (what, syntax.stderr)
            bed.run(["bash", str(bed.users[0] / "node.sh"), role])
    elif template.endswith(".yaml.j2"):
        config = yaml.safe_load(text)
        assert isinstance(config, dict) and set(config) == baseline_keys, what
        commands = _commands(config)
        assert commands or template in NO_COMMANDS, what
        for command in commands:
            syntax = bed.run(["bash", "-n", "-c", command])
            assert syntax.returncode == 0, (what, command, syntax.stderr)
            bed.run(["bash", "-c", command])
    else:
        path = bed.work / "script.sh"
        path.write_text(text)
        syntax = bed.run(["bash", "-n", str(path)])
        assert syntax.returncode == 0, (what, syntax.stderr)
        # Scripts take their arguments as `up` gives them (the local start script: its temp dir).
        bed.run(["bash", str(path), str(bed.work / "temp")])
    assert not bed.marker.exists(), f"{template}: {what} ran the injected command"


def _renders(tmp_path: Path, bed: Bed) -> list[tuple[str, dict[str, Any]]]:
    """Each template as its provider renders it, with the context it got."""
    calls: list[tuple[str, dict[str, Any]]] = []
    real: Callable[..., str] = render.render

    def recording(template: str, **context: Any) -> str:
        calls.append((template, copy.deepcopy(context)))
        return real(template, **context)

    mp = pytest.MonkeyPatch()
    mp.setattr(render, "render", recording)
    try:
        specs = tmp_path / "specs"
        specs.mkdir()
        local = specs / "loc.yaml"
        local.write_text("provider: local\ntracking: mlflow\nnum_cpus: 2\nnum_gpus: 0\n"
                         "object_store_memory_mb: 100\nresources: {special: 2}\nport_base: 23000\n")
        providers.create(loading.load_spec(local)).plan(None)
        common = ("provider: slurm\ncpus_per_node: 4\ntracking: mlflow\n"
                  "autodown: {idle_minutes: 30}\npartition: cpu\n"
                  "extra_sbatch_options: [--mail-type=END]\n"
                  "environment: {modules: [python/3.11], activate: ~/envs/ray, "
                  "env_vars: {OMP_NUM_THREADS: '1'}}\n")
        for name, shape in (("slm", "worker_types:\n  cpu: {cpus_per_node: 4, max_workers: 3}\n"),
                            ("het", "gpu_workers: {nodes: 1, partition: gpu, cpus_per_node: 8, "
                                    "gpus_per_node: 4}\n")):
            slurm = specs / f"{name}.yaml"
            slurm.write_text(common + shape)
            slurm_spec = loading.load_spec(slurm)
            assert isinstance(slurm_spec, SlurmSpec)
            script.render_script(slurm_spec)
        lam = specs / "lam.yaml"
        lam.write_text(yaml.safe_dump({
            "provider": "lambda", "tracking": "mlflow", "env": "gpu",
            "ssh_proxy_command": "ssh -W %h:%p jump@bastion.example.com",
            "head": {"choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}]},
            "workers": {"count": 1, "choices": [{"instance_type": "gpu_1x_a10",
                                                 "region": "us-east-1"}]}}))
        lam_spec = loading.load_spec(lam)
        assert isinstance(lam_spec, LambdaSpec)
        raycluster.render_config(lam_spec, "198.51.100.10", ["198.51.100.11"], Path("/k/id"),
                                 "0123abcd", "10.0.0.5")
        raycluster.node_conf(lam_spec, "10.0.0.5")
        auto = specs / "auto.yaml"
        auto.write_text(yaml.safe_dump({
            "provider": "lambda", "tracking": "mlflow", "env": "gpu",
            "head": {"choices": [{"instance_type": "gpu_1x_a10", "region": "us-east-1"}]},
            "worker_types": {"gpu": {"choices": [{"instance_type": "gpu_1x_a10",
                                                  "region": "us-east-1"}], "max_workers": 2,
                                     "resources": {"CPU": 8, "GPU": 1}}}}))
        auto_spec = loading.load_spec(auto)
        assert isinstance(auto_spec, LambdaSpec)
        autoscale.render_config(auto_spec, "0123abcd", "me", "us-east-1", "key", ["rs"], None, 1.0,
                                "10.0.0.5")
        autoscale.node_conf(auto_spec, "i-1", "10.0.0.5")
        gcp = write_gcp_spec(specs, name="gcp", tracking="mlflow",
                             dashboard={"port": 8300, "allowed_source_ranges": ["198.51.100.0/24"]})
        providers.create(loading.load_spec(gcp)).plan(None)
    finally:
        mp.undo()
    # The local start script's `ray` (the first on PATH after its Ray's folder) is real: the
    # stubs' stands in (the real setup/users/ray.sh runs it).
    for template, context in calls:
        if template == "local.start.sh.j2":
            context["ray_bin"] = str(bed.stubs)
            for secret in context["tracking_files"].values():  # `up` writes it before the start
                Path(secret).parent.mkdir(parents=True, exist_ok=True)
                Path(secret).write_text("x")
    assert {t for t, _ in calls} | INCLUDED == {p.name for p in paths.templates_dir().glob("*.j2")}
    return calls


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    made = Bed(tmp_path / "bed")
    try:
        yield made
    finally:
        made.cleanup()


@pytest.mark.slow  # hundreds of short bash runs: about 40 s on the 2-core machine
def test_every_template_withstands_hostile_values(tmp_path: Path, rf_home: Path, bed: Bed) -> None:
    hostile = _hostile(bed.marker)
    refused: dict[str, list[Leaf]] = {}
    accepted = 0
    renders = _renders(tmp_path, bed)
    # The start lines of the YAML configs run node.sh, which reads a node.conf.
    default_conf = next(render.render(t, **c) for t, c in renders if t == "node.conf.j2")
    for template, context in renders:
        bed.conf(default_conf)
        valid = render.render(template, **context)
        keys = set(yaml.safe_load(valid)) if template.endswith(".yaml.j2") else None
        log = bed.root / "calls.log"
        log.write_text("")
        _check(template, valid, keys, bed, "the valid render")
        # The harmless run gets as far as starting Ray (a stub), so the values were all used.
        assert template in NO_COMMANDS or "ray start" in log.read_text() \
            or " start " in log.read_text(), (template, log.read_text())
        for leaf in _leaves(context):
            changed = _replaced(context, leaf, hostile)
            try:
                text = render.render(template, **changed)
            except Exception:  # refused (a filter, or a comparison that needs a number)
                refused.setdefault(template, []).append(leaf)
                continue
            accepted += 1
            _check(template, text, keys, bed, f"{leaf} = hostile")
    # Most values are data that quoting makes harmless; the checked spots refuse.
    assert accepted > 50, accepted
    assert not bed.marker.exists()


def test_the_checking_filters_refuse_what_would_break_out(tmp_path: Path) -> None:
    env = render.environment()
    bad = {
        "{{ v | varname }}=1": "A;touch x",
        "echo $((1 + {{ v | integer }}))": "a[$(touch x)]",
        'echo "{{ v | expand }}"': "$(touch x)",
        "cat <<'END'\n{{ v | heredoc('END') }}\nEND": "x\nEND\ntouch x",
        "#SBATCH {{ v | sbatch }}": "--x=1\ntouch x",
        "chmod 600 {{ v | word }}": "a;touch x",
    }
    for source, value in bad.items():
        template = env.from_string(source)
        template.name = "t.sh.j2"
        with pytest.raises(render.RenderError):
            template.render(v=value)
    comment = env.from_string("# {{ v | comment }}\necho ok")
    comment.name = "t.sh.j2"
    out = comment.render(v="x\ntouch x")
    assert out.splitlines() == ["# x\\ntouch x", "echo ok"]
    # Unfiltered, a value in a shell template is one quoted word.
    plain = env.from_string("echo {{ v }}")
    plain.name = "t.sh.j2"
    assert plain.render(v="a b;c") == "echo 'a b;c'"

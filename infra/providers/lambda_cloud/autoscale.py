"""Autoscaling clusters (`worker_types` in the spec): the head runs Ray's autoscaler (v2) with our
node provider (node_provider.py); this module is the user's-machine side.

`up` launches the head itself (fleet.py: choices, tags, ruleset, lost launches), then over its own
SSH (pinned host key) copies to the head: our node provider package from this checkout
(`~/rayfleet/pkg`), the cluster's Ray token, the Lambda API key and the cluster's private key (all
0600 files, never on a command line, never in a rendered file), and the autoscaler config (no
secret in it: Ray copies it around and logs it). It then starts Ray on the head with
`--autoscaling-config`, `RAY_enable_autoscaler_v2=1` and `RAY_CLOUD_INSTANCE_ID=<head id>`; the
autoscaler launches `min_workers` and whatever jobs need, and sets them up over SSH from the head.
Why v2 and not v1: NOTES.md.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from infra.core import auth, node_start, paths, privilege, remote_head, render, shipping, ssh, ui, versions
from infra.core.tracking import client as tracking
from infra.core.tracking import remote as tracking_remote
from infra.node import shell
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud import raycluster, users

if TYPE_CHECKING:
    from infra.core.head_ssh import SshHead
    from infra.core.state import State
    from infra.providers.lambda_cloud.spec import Spec

NODE_PROVIDER = "infra.node.lambda_cloud.node_provider.LambdaNodeProvider"
HEAD_TYPE = "head"
#: On the head, relative to the login user's home.
CONFIG_FILE = "rayfleet/autoscaler.yaml"
#: The same config as rendered on this machine (`.rayfleet/rendered/<cluster>/`).
RENDERED = "autoscaler.yaml"
#: The Lambda API key on the head (0600), for its autoscaler and idle watcher; not the user's
#: own key file on this machine (infra/node/lambda_cloud/api.py LAMBDA_KEYS_FILE).
HEAD_API_KEY_FILE = ".rayfleet/lambda-api-key"
BOOTSTRAP_KEY = "ray_bootstrap_key.pem"
TOKEN_FILE = auth.NODE_TOKEN_PATH.removeprefix("~/")
#: Which commit the head's node package came from, beside the zips.
VERSION_FILE = f"{shipping.NODE_DIR}/VERSION"
#: The node environments' installer (setup/) in the worker kit: it reaches each worker with the
#: kit's one file mount, not a second one (Ray's updater pays an SSH `mkdir` and an rsync per
#: mount on every worker's way to joining: issue 38).
KIT_SETUP = f"{users.WORKER_KIT}/setup"


def head_tags(spec: Spec) -> dict[str, str]:
    """Ray's tags for the head, on the instance: v2 will not scale until it lists the head."""
    return {"ray-node-type": "head", "ray-user-node-type": HEAD_TYPE,
            "ray-node-name": f"ray-{spec.name}-head"}


def worker_resources(spec: Spec, types: dict[str, api.InstanceType] | None) -> dict[str, dict[str, float]]:
    out = {}
    for name, kind in (spec.worker_types or {}).items():
        if kind.resources is not None:
            out[name] = dict(kind.resources)
            continue
        info = (types or {}).get(kind.choices[0].instance_type)
        specs = info.specs if info else {}
        resources = {"CPU": float(specs.get("vcpus", 1))}
        if specs.get("gpus"):
            resources["GPU"] = float(specs["gpus"])
        out[name] = resources
    return out


def render_config(spec: Spec, cluster_id: str, owner: str, region: str, key_name: str,
                  rulesets: list[str], types: dict[str, api.InstanceType] | None,
                  rate_scale: float, head_private_ip: str | None = None) -> str:
    """The autoscaler's cluster config (templates/lambda.autoscaler.yaml.j2), as Ray wants it for
    an external provider. Paths only; no secret."""
    worker_types = spec.worker_types or {}
    resources = worker_resources(spec, types)
    extra = raycluster.object_store_flag(spec)
    # The installer of the node's users, the token, the tracking password (users.py) and the
    # node environments' installer, from the autoscaler's home to each worker in one mount.
    mounts = users.kit_mount()
    setup = [install_command(spec)] if spec.env != "none" else []
    return render.render(
        "lambda.autoscaler.yaml.j2",
        cluster=spec.name, max_workers=sum(k.max_workers for k in worker_types.values()),
        idle_timeout_minutes=spec.idle_timeout_minutes, module=NODE_PROVIDER,
        cluster_id=cluster_id, owner=owner, region=region, ssh_key_name=key_name,
        firewall_rulesets=rulesets, api_key_file=f"~/{HEAD_API_KEY_FILE}",
        state_file="~/.rayfleet/lambda-nodes.json", rate_scale=rate_scale,
        ssh_user=spec.ssh_user, ssh_private_key=f"~/{BOOTSTRAP_KEY}", head_type=HEAD_TYPE,
        worker_types=[{"name": name, "choices": [c.model_dump() for c in kind.choices],
                       "resources": resources[name], "min_workers": kind.min_workers,
                       "max_workers": kind.max_workers} for name, kind in worker_types.items()],
        file_mounts=mounts,
        # Shell built here from our own words (install_command, users.py): printed as is.
        worker_setup_commands=[render.Shell(c) for c in setup],
        worker_start_commands=[render.Shell(c) for c in users.worker_start(
            raycluster.activate(spec), raycluster.node_env_prefix(spec, head_private_ip),
            raycluster.GCS_PORT, extra, spec.tracking == "mlflow", kit=True)],
    )


def install_command(spec: Spec, head: bool = False) -> str:
    """The node environment's install on the head (from its own copy of setup/) or on a worker
    (from the worker kit)."""
    args = versions.install_args(spec.env, backend=spec.env_backend)
    # Only the head runs Prometheus (`metrics: prometheus`).
    metrics = " --metrics" if head and spec.metrics == "prometheus" else ""
    source = raycluster.REMOTE_SETUP if head else f"~/{KIT_SETUP}"
    return (f"bash {source}/install.sh {shlex.join(args)} "
            f'--prefix "{raycluster.ENV_PREFIX}" --log "$HOME/rayfleet/install.log"{metrics}')


def head_start_command(spec: Spec, head_id: str, head_private_ip: str | None = None) -> str:
    """Ray on the head as Ray's user without its own autoscaler (node.sh, with node_conf's
    node.conf), then Ray's v2 monitor as the autoscaler's user, who alone holds the API key and
    the cluster's SSH key (users.py)."""
    tracking = spec.tracking == "mlflow"
    env, args = _head_start_words(spec, head_id, head_private_ip)
    # The API key's only copy on the head is then the autoscaler's user's.
    return users.head_start(raycluster.activate(spec), env, args, scaler_files(tracking),
                            monitor_command(spec, head_private_ip), tracking, (HEAD_API_KEY_FILE,))


def _head_start_words(spec: Spec, head_id: str, head_private_ip: str | None) -> tuple[str, str]:
    """The head's words before `ray start`, and its flags."""
    # v2 on the head: GCS serves the autoscaler state v2's monitor reads. Ray reports the head's
    # instance id (RAY_CLOUD_INSTANCE_ID), without which v2 does not scale.
    env = (f"RAY_enable_autoscaler_v2=1 RAY_CLOUD_INSTANCE_ID={shlex.quote(head_id)} "
           f"RAY_NODE_TYPE_NAME={HEAD_TYPE} "
           f"{raycluster.node_env_prefix(spec, head_private_ip)}{raycluster.head_env(spec)}"
           "RAY_USAGE_STATS_ENABLED=0 ")
    args = (f"--port={raycluster.GCS_PORT} --dashboard-host=127.0.0.1 "
            f"--dashboard-port={raycluster.DASHBOARD_PORT} --disable-usage-stats"
            f"{raycluster.object_store_flag(spec)}")
    return env, args


def node_conf(spec: Spec, head_id: str, head_private_ip: str | None) -> str:
    """The autoscaling cluster's node.conf (infra/core/node_start.py): the head's start (SFTP'd
    beside node.sh) and each worker's (in the worker kit)."""
    tracking = spec.tracking == "mlflow"
    env, args = _head_start_words(spec, head_id, head_private_ip)
    roles = {"head": users.head_role(env, args, scaler_files(tracking), tracking,
                                     (HEAD_API_KEY_FILE,)),
             "worker": users.worker_role(raycluster.node_env_prefix(spec, head_private_ip),
                                         raycluster.GCS_PORT, raycluster.object_store_flag(spec),
                                         tracking)}
    return node_start.conf(spec.name, "infra/providers/lambda_cloud/autoscale.py (node_conf)",
                           roles, activate="" if spec.env == "none" else raycluster.ACTIVATE_SCRIPT)


def monitor_command(spec: Spec, head_private_ip: str | None, replace: bool = True) -> str:
    """Ray's v2 monitor with our node provider, supervised, as the autoscaler's user
    (privilege.start_monitor; `replace`: stop the one that runs first)."""
    # One node per launch batch: v2 fails a whole batch on one error, and ours launch one by one.
    # A loop a second (Ray's default is 5 s): demand reaches create_node within ~1 s, and the
    # provider answers Ray's per-loop calls from its cache, so the API sees no more requests.
    monitor_env = {"RAY_enable_autoscaler_v2": "1", "AUTOSCALER_MAX_LAUNCH_BATCH": "1",
                   "AUTOSCALER_UPDATE_INTERVAL_S": "1", **auth_env(spec)}
    gcs = f"{head_private_ip or '127.0.0.1'}:{raycluster.GCS_PORT}"
    return privilege.start_monitor(gcs, CONFIG_FILE, shipping.head_path(), monitor_env,
                                   raycluster.activate(spec), replace=replace)


def auth_env(spec: Spec) -> dict[str, str]:
    """How the autoscaler's user reaches GCS: with its own copy of the token, or none."""
    if spec.auth != "token":
        return {"RAY_AUTH_MODE": "disabled"}
    return auth.node_env(shell.home(f"~/{TOKEN_FILE}"))


def scaler_files(tracking: bool) -> tuple[str, ...]:
    return users.scaler_files(HEAD_API_KEY_FILE, BOOTSTRAP_KEY, CONFIG_FILE, shipping.NODE_DIR,
                              tracking)


def setup_files(*prefixes: str) -> dict[str, tuple[bytes, int]]:
    """setup/ as shipped, once under each of `prefixes` (home-relative path -> (content, mode));
    each file is read once."""
    setup = paths.setup_dir()
    tree = {str(file.relative_to(setup)): (file.read_bytes(), file.stat().st_mode & 0o755)
            for file in sorted(p for p in setup.rglob("*") if p.is_file())}
    return {f"{prefix}/{path}": entry for prefix in prefixes for path, entry in tree.items()}


def bootstrap(spec: Spec, state: State, head_at: SshHead, head: api.Instance,
              config_text: str, api_key: str, private_key: Path, start: bool = True) -> None:
    """Copy the node package (one zip), secrets and config to the head, install its env, start
    Ray there.

    With `start` False (Ray already runs), only the files are replaced: v2 re-reads the config
    every loop."""
    token_file = auth.token_file(state)
    token = token_file.read_bytes() if token_file is not None else None
    conf = node_conf(spec, head.id, raycluster.private_address(head))
    files: dict[str, tuple[bytes, int]] = {
        VERSION_FILE: (versions_line(paths.PROJECT_ROOT).encode(), 0o644),
        HEAD_API_KEY_FILE: (api_key.encode(), 0o600),
        BOOTSTRAP_KEY: (private_key.read_bytes(), 0o600),
        CONFIG_FILE: (config_text.encode(), 0o644),
        # The head's start (node.sh, node.conf): makes the two users (Ray's, the autoscaler's),
        # hands over files, starts Ray as Ray's user.
        **node_start.files(conf),
        **({TOKEN_FILE: (token, 0o600)} if token is not None else {})}
    password = None
    if spec.tracking == "mlflow":
        # Before Ray starts: the head's `ray start` reads it, workers get it from their kit.
        password = tracking.ensure_credentials(spec.name).read_bytes()
        files[tracking_remote.NODE_PASSWORD_PATH] = (password, 0o600)
    files.update(users.kit_files(token, password, conf))
    if spec.env != "none":
        # The head's own install, and the workers' in their kit.
        files.update(setup_files(raycluster.REMOTE_SETUP.removeprefix("~/"), KIT_SETUP))
    with ui.step(f"copying the node provider, token and keys to the head {head.ip}"):
        remote_head.put_files(head_at.target, files)
    if not start:
        # The running autoscaler reads its own user's copy of the config (v2 re-reads it); one
        # runs, whatever ended the last (its supervisor killed too).
        mlflow = spec.tracking == "mlflow"
        head_at.run(shell.all_of(
            privilege.setup_users(users.ray_files(mlflow), scaler_files(mlflow),
                                  (HEAD_API_KEY_FILE,)),
            monitor_command(spec, raycluster.private_address(head), replace=False)),
            timeout=120, check=True)
        return
    if spec.env != "none":
        with ui.step("installing the node environment on the head"):
            head_at.run(install_command(spec, head=True), timeout=spec.ray_timeout_s, check=True)
    start_command = head_start_command(spec, head.id, raycluster.private_address(head))
    with ui.step("starting Ray and the autoscaler on the head"):
        try:
            head_at.run(start_command, timeout=spec.ray_timeout_s, check=True)
        except ssh.SshError as exc:
            # `ray start` gives its raylet a fixed 30 s to register; a busy machine can miss that.
            # Once more (it begins with `ray stop`), then the error stands.
            if "timed out during startup" not in str(exc):
                raise
            ui.warn("Ray's start on the head timed out (a busy machine?); trying once more")
            head_at.run(start_command, timeout=spec.ray_timeout_s, check=True)


def versions_line(root: Path) -> str:
    """Which commit the head's package came from (the same the user runs)."""
    import subprocess

    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=False).stdout.strip()
    except OSError:
        commit = ""
    return f"rayfleet {commit or 'unknown commit'}\n"


def hourly_range(spec: Spec, types: dict[str, api.InstanceType] | None) -> tuple[int, int] | None:
    """($/h at min size, at max size) in cents, with the head's first choice and each type's
    first choice; None without prices."""
    if not types:
        return None
    head = types.get(spec.head.choices[0].instance_type)
    if head is None:
        return None
    low = high = head.price_cents_per_hour
    for kind in (spec.worker_types or {}).values():
        info = types.get(kind.choices[0].instance_type)
        price = info.price_cents_per_hour if info else 0
        low += kind.min_workers * price
        high += kind.max_workers * price
    return low, high

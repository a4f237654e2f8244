"""Ray on the instances: render the `type: local` cluster config, `ray up`, checks, `ray down`.

Ray's on-prem provider needs every node's address before `ray up`, and it starts the workers
from the head over SSH, so a head that cannot log into a worker silently gives a one-node
cluster. We therefore check head -> worker SSH ourselves right after `ray up` and wait until Ray
reports every node alive, naming the node and the reason when one does not join.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.core import auth, jobs, node_start, paths, privilege, render, ssh, ui, versions
from infra.core.errors import ProviderError
from infra.core.metrics import remote as metrics_remote
from infra.core.tracking import client as tracking
from infra.core.tracking import remote as tracking_remote
from infra.node import shell
from infra.node.where import ray_executable
from infra.providers.lambda_cloud import users

if TYPE_CHECKING:
    from infra.core.head import HeadAccess
    from infra.node.lambda_cloud import api
    from infra.providers.lambda_cloud.spec import Spec

GCS_PORT = 6379
DASHBOARD_PORT = 8265
#: Ray's default Ray Client server port (`ray start --head` opens it; drivers use ray://).
CLIENT_PORT = 10001
CONFIG_FILE = "cluster.yaml"
#: Where setup/ lands on each node and where install.sh puts the env (fixed, shell-safe strings).
REMOTE_SETUP = "~/rayfleet/setup"
ENV_PREFIX = "$HOME/rayfleet/env"
#: Ray run with these for `ray up`/`ray down`: no usage reports; the autoscaler v1, with which a
#: `ray up` of an on-prem cluster from another machine does start its workers (Ray 2.60).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_UP_enable_autoscaler_v2": "0"}


#: Ray's autoscaler runs apart as its own user (users.py) and logs into that user's home.
MONITOR_LOGS = f"~{privilege.SCALER_USER}/{privilege.SCALER_LOGS}/monitor.*"


class RayClusterError(ProviderError):
    """`ray up` failed, or a node did not join; the message names the node and the reason."""


def activate(spec: Spec) -> str:
    """Shell prefix that puts the node env's `ray` and `python` first on the PATH."""
    return "" if spec.env == "none" else shell.before(
        shell.argv(".", shell.home(f"{ENV_PREFIX}/rayfleet-activate.sh")))


#: Where nodes keep the cluster's Ray token (auth.NODE_TOKEN_PATH, spelled for a shell).
NODE_TOKEN = shell.home(auth.NODE_TOKEN_PATH)


def private_address(instance: api.Instance) -> str:
    """An instance's address as the cluster's other nodes reach it (its public one where Lambda
    lists no private one)."""
    return str(instance.private_ip or instance.ip)


#: Before the head exists (`plan`), the tracking server's address in rendered files says so.
HEAD_PRIVATE_IP_PLACEHOLDER = "HEAD_PRIVATE_IP_AFTER_LAUNCH"


def node_env_prefix(spec: Spec, head_private_ip: str | None = None) -> str:
    """`VAR=value ` words that make `ray start` know its cluster's address, use token auth with
    the node's 0600 token file and, with `tracking: mlflow`, find the head's tracking server
    (password read from the node's 0600 copy when Ray starts: tracking_remote.node_env_prefix)."""
    head = head_private_ip or HEAD_PRIVATE_IP_PLACEHOLDER
    # The cluster's own address: Ray's tools in jobs and actors (the state API, e.g. Ray Train's
    # placement group cleaner) then never scan the machine for "the" Ray.
    words: str = shell.prefix({"RAY_ADDRESS": f"{head}:{GCS_PORT}"})
    if spec.tracking == "mlflow":
        words += tracking_remote.node_env_prefix(head)
    if spec.auth != "token":
        return words + shell.prefix({"RAY_AUTH_MODE": "disabled"})
    return words + shell.prefix(auth.node_env(NODE_TOKEN))


def head_env(spec: Spec) -> str:
    """`VAR=value ` words for the head's `ray start` only: where the cluster's Prometheus is."""
    return metrics_remote.node_env_words() if spec.metrics == "prometheus" else ""


def ray_cluster_name(spec: Spec, cluster_id: str) -> str:
    """Ray's name for the cluster: ours plus the cluster id. Ray's on-prem launcher keeps its
    state in /tmp/ray/cluster-<name>.state on this machine, shared by every checkout: two
    checkouts with a cluster of the same name must not share (and rewrite) one file."""
    return f"{spec.name}-{cluster_id}"


def render_config(spec: Spec, head_ip: str, worker_ips: list[str], key_path: Path,
                  cluster_id: str, head_private_ip: str | None = None) -> str:
    file_mounts: dict[str, str] = {}
    if spec.auth == "token":
        # Ray copies the local 0600 file (rsync keeps the mode); the token itself is never in
        # this file, which Ray copies to the head and logs.
        file_mounts[auth.NODE_TOKEN_PATH] = str(auth.token_path(spec.name))
    if spec.tracking == "mlflow":
        # The tracking password reaches every node the same way.
        file_mounts[tracking_remote.NODE_PASSWORD_PATH] = str(tracking.password_path(spec.name))
    head_setup: list[str] = []
    if spec.env == "none":
        setup: list[render.Shell] = []
    else:
        file_mounts[REMOTE_SETUP] = str(paths.setup_dir())
        args = versions.install_args(spec.env, backend=spec.env_backend)
        setup = [render.Shell(f"bash {REMOTE_SETUP}/install.sh {shlex.join(args)} "
                              f'--prefix "{ENV_PREFIX}" --log "$HOME/rayfleet/install.log"')]
        if spec.metrics == "prometheus":
            # A second run on the head adds only Prometheus (the env is already there).
            head_setup = [render.Shell(setup[0] + " --metrics")]
    # The node users' scripts with this cluster's node.conf (node_conf), staged by `up`.
    file_mounts[f"~/{privilege.USERS_DIR}"] = str(
        paths.rendered_dir(spec.name) / node_start.STAGED)
    return render.render(
        "lambda.yaml.j2",
        cluster=ray_cluster_name(spec, cluster_id), head_ip=head_ip, worker_ips=worker_ips,
        ssh_user=spec.ssh_user,
        ssh_private_key=str(key_path), ssh_proxy_command=spec.ssh_proxy_command,
        file_mounts=file_mounts, setup_commands=setup,
        # Shell built here from our own words (users.py): printed as is.
        head_start_commands=[render.Shell(c) for c in users.fixed_head_start()],
        worker_start_commands=[render.Shell(c) for c in users.worker_start(
            activate(spec), node_env_prefix(spec, head_private_ip), GCS_PORT,
            object_store_flag(spec), spec.tracking == "mlflow")],
        head_setup_commands=head_setup,
    )


def object_store_flag(spec: Spec) -> str:
    """` --object-store-memory=N` for `ray start` when the spec sets it, else nothing."""
    mb = spec.object_store_memory_mb
    return f" --object-store-memory={int(mb) * 1024 * 1024}" if mb else ""


#: The node env's activation on a node, for node.conf (empty with `env: none`).
ACTIVATE_SCRIPT = shell.home(f"{ENV_PREFIX}/rayfleet-activate.sh")


def node_conf(spec: Spec, head_private_ip: str | None = None) -> str:
    """The fixed-size cluster's node.conf (infra/core/node_start.py): how its head and workers
    start Ray, as Ray's user, in the cluster's address, token and tracking settings."""
    node_env, extra, mlflow = node_env_prefix(spec, head_private_ip), object_store_flag(spec), \
        spec.tracking == "mlflow"
    roles = {"head": users.fixed_head_role(
                 f"{node_env}{head_env(spec)}RAY_USAGE_STATS_ENABLED=0",
                 f"--port={GCS_PORT} --dashboard-host=127.0.0.1 --dashboard-port={DASHBOARD_PORT} "
                 f"--disable-usage-stats{extra}", mlflow),
             "worker": users.worker_role(node_env, GCS_PORT, extra, mlflow)}
    return node_start.conf(spec.name, "infra/providers/lambda_cloud/raycluster.py (node_conf)",
                           roles, activate="" if spec.env == "none" else ACTIVATE_SCRIPT)


def config_path(cluster: str) -> Path:
    return paths.rendered_dir(cluster) / CONFIG_FILE


def _log(cluster: str, name: str) -> Path:
    path = paths.home() / "logs" / cluster / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _run_ray(args: list[str], log: Path, timeout: float, extra_env: dict[str, str]) -> int:
    env = {**os.environ, **RAY_ENV, **extra_env}
    if os.environ.get("RAY_USAGE_STATS_ENABLED") == "1":
        env["RAY_USAGE_STATS_ENABLED"] = "1"  # the user opted in explicitly
    with log.open("w") as out:
        try:
            return subprocess.run([ray_executable(), *args], stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env, timeout=timeout,
                                  check=False).returncode
        except subprocess.TimeoutExpired:
            return -1


def ray_up(spec: Spec, path: Path, client_env: dict[str, str]) -> None:
    log = _log(spec.name, "ray-up.log")
    with ui.step(f"ray up (setup and Ray on {spec.fixed_workers + 1} node(s); log {log})"):
        code = _run_ray(["up", "-y", "--no-config-cache", str(path)], log, spec.ray_timeout_s,
                        client_env)
    if code != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-3:]
        reason = "timed out" if code == -1 else f"exited {code}"
        raise RayClusterError(f"`ray up` {reason}: {' | '.join(tail)[-300:]}; full log: {log}")


def head_reaches_workers(head: HeadAccess, user: str, workers: dict[str, str]) -> list[str]:
    """From the head, log into each worker with the key Ray copied there; problems by worker."""
    options = ("-i ~/ray_bootstrap_key.pem -o BatchMode=yes -o StrictHostKeyChecking=no "
               "-o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 -o LogLevel=ERROR")
    problems = []
    for name, ip in workers.items():
        command = f"ssh {options} {shlex.quote(f'{user}@{ip}')} true"
        try:
            result = head.run(command, timeout=60)
        except ssh.SshError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if not result.ok:
            reason = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
            problems.append(f"the head cannot SSH to {name} ({ip}): {reason}")
    return problems


def alive_nodes(dashboard_url: str, token_path: Path | None) -> list[dict[str, Any]]:
    from infra.core.endpoint import Endpoint

    nodes = jobs.list_nodes(Endpoint(dashboard_url, "", tunneled=True, token_path=token_path))
    return [{"ip": n.node_ip, "head": n.is_head_node, "resources": dict(n.resources_total or {})}
            for n in nodes if n.state == "ALIVE"]


def wait_all_alive(dashboard_url: str, expected: dict[str, set[str]], timeout: float,
                   token_path: Path | None) -> None:
    """Wait until Ray reports a live node at one of each instance's addresses."""

    def check(step: ui.Step) -> bool | None:
        try:
            ips = {n["ip"] for n in alive_nodes(dashboard_url, token_path)}
        except Exception as exc:  # the dashboard may still be starting
            step.detail(f"dashboard not answering yet ({type(exc).__name__})")
            return None
        missing = sorted(name for name, addrs in expected.items() if not addrs & ips)
        if not missing and not jobs.dashboard_ready(dashboard_url, token_path):
            step.detail("all nodes alive; the job API is not answering yet")
            return None
        step.detail(f"{len(expected) - len(missing)}/{len(expected)} nodes alive"
                    + (f"; waiting for {', '.join(missing)}" if missing else ""))
        return True if not missing else None

    ui.wait_for(check, f"Ray to report {len(expected)} node(s) alive", timeout=timeout, interval=1.0,
                hint=f"the worker did not join: see {MONITOR_LOGS} on the head")


def wait_workers(dashboard_url: str, minimum: int, timeout: float, token_path: Path | None) -> None:
    """Wait until Ray reports the head and at least `minimum` workers alive (autoscaling)."""

    def check(step: ui.Step) -> bool | None:
        try:
            nodes = alive_nodes(dashboard_url, token_path)
        except Exception as exc:  # the dashboard may still be starting
            step.detail(f"dashboard not answering yet ({type(exc).__name__})")
            return None
        workers = sum(1 for n in nodes if not n["head"])
        heads = sum(1 for n in nodes if n["head"])
        # The job API is a dashboard module of its own that may come up after the state API.
        jobs_ready = bool(heads) and jobs.dashboard_ready(dashboard_url, token_path)
        step.detail(f"head {'alive' if heads else 'not yet'}, job API "
                    f"{'ready' if jobs_ready else 'not yet'}, {workers}/{minimum} worker(s)")
        return True if jobs_ready and workers >= minimum else None

    ui.wait_for(check, f"Ray on the head and {minimum} worker(s) (min_workers) alive",
                timeout=timeout, interval=1.0,
                hint=f"see {MONITOR_LOGS} on the head")


@contextmanager
def dashboard_tunnel(head: HeadAccess) -> Iterator[str]:
    with head.tunnel(DASHBOARD_PORT) as port:
        yield f"http://127.0.0.1:{port}"

"""The two users of a gcp-tpu node (infra/core/privilege.py), and the start commands that run Ray and
its autoscaler as them; what a job there can reach (issue 29), as `plan` and `status` say it.

The head (`ray up` with Ray's unpatched GCP provider): Ray's file mounts and `ray up` leave the
token, the tracking password, the installer, Ray's config and the cluster's key in the SSH
user's home; setup/users/users.sh hands Ray's user the token (and password) and the autoscaler's
user all of it; setup/users/guard.sh then lets only root and the autoscaler's user reach the metadata server,
which hands the VM's service-account token to whoever asks; `ray start --head --no-monitor` runs
as Ray's user, and Ray's v1 monitor, the idle watcher and the queued-slice joiner as the
autoscaler's. Workers and TPU hosts (set up by that monitor over SSH as the SSH user): the same
users and guard, Ray's TPU attributes read from the metadata server as root and handed to Ray as
its own variables (setup/users/gcp_tpu_env.sh), then Ray as Ray's user. NOTES.md says why.
"""

from __future__ import annotations

from infra.core import node_start, paths, privilege
from infra.core.metrics import remote as metrics_remote
from infra.core.tracking import client as tracking
from infra.core.tracking import remote as tracking_remote
from infra.node import shell

#: What `plan` and `status` print about a job on a gcp-tpu cluster.
JOB_REACH = privilege.job_reach(
    f"the metadata server (the VM's service-account token: it answers root and "
    f"{privilege.SCALER_USER} only)", "the autoscaler, the idle watcher and the slice joiner")
#: The metadata server by address and by name (guard.sh resolves the name on the node: Google's
#: resolver answers 169.254.169.254; a test bed's answers with its offline server), and by its
#: IPv6 address, which it answers on dual-stack subnets and which no name resolves to (a job
#: could connect to it by number).
METADATA = ("169.254.169.254", "fd20:ce::254", "metadata.google.internal")
#: Ray's GCS port on the head (the template's `ray start --head --port`).
GCS_PORT = 6379
#: setup/ on a node, home-relative: a file mount the autoscaler syncs to every new worker.
SETUP_DIR = "rayfleet/setup"
#: setup/users/gcp_tpu_env.sh on a node, home-relative.
TPU_ENV_SCRIPT = f"{privilege.USERS_DIR}/gcp_tpu_env.sh"
#: What it printed, in Ray's user's home (its .rayfleet, made by users.sh with the token).
TPU_ENV_FILE = ".rayfleet/tpu-env"
#: The node env (setup/install.sh's prefix, in the SSH user's home, traversable by the node
#: users: setup/users/users.sh) first on the PATH: a prefix for the SSH user's shell, so that a
#: daemon it starts as another node user (`privilege.as_user`) finds that env's Python.
ACTIVATE = shell.before(shell.export({"PATH": shell.Shell('"$HOME/rayfleet/env/bin:$PATH"')}))
#: That env's Python, for a command after ACTIVATE, as any node user: it has Ray, requests and
#: Google's client library (installed there for the autoscaler).
PYTHON = "python"
#: Who runs the head's daemons that need the VM's service account (the idle watcher, which
#: deletes the cluster, and the queued-slice joiner, which queues and joins slices): the
#: autoscaler's user, the one that the metadata server answers besides root (guard.sh).
DAEMON_USER = privilege.SCALER_USER


def _node_env(head_ip: str, token: bool, tracking_on: bool) -> str:
    """`VAR=value ` words for a node's `ray start` as Ray's user (`$HOME` is that user's; the
    password is read from its 0600 copy by that shell: on no command line)."""
    # The cluster's own address: Ray's tools in jobs find the cluster by it, not by a scan.
    env: dict[str, str] = {"RAY_ADDRESS": shell.expanding(f"{head_ip}:{GCS_PORT}")}
    if token:
        env.update(RAY_AUTH_MODE="token",
                   RAY_AUTH_TOKEN_PATH=shell.expanding(f"$HOME/{privilege.TOKEN_FILE}"))
    else:
        env["RAY_AUTH_MODE"] = "disabled"
    if tracking_on:
        plain, from_files = tracking.node_env(
            tracking_remote.node_url(head_ip), tracking_remote.NODE_PASSWORD_PATH)
        env.update({key: shell.expanding(value) for key, value in plain.items()})
        # Read from the file by the shell that starts Ray: on no command line.
        env.update({key: shell.Shell(f'"$(cat {shell.expanding("$HOME/" + path.removeprefix("~/"))})"')
                    for key, path in from_files.items()})
    return "ulimit -n 65536 2>/dev/null; " + shell.prefix(env)


def head_start(token: bool, tracking_on: bool, metrics: bool, dashboard_host: str,
               dashboard_port: int) -> list[str]:
    """The head's start command (run by `ray up` over SSH as the SSH user): node.sh with
    node_conf's node.conf (the arguments are node_conf's; the bench's baseline takes them)."""
    return [node_start.command("head")]


def worker_start(token: bool, tracking_on: bool) -> list[str]:
    """A worker's or TPU host's start command (run by the head's autoscaler, or the slice
    joiner, over SSH as the SSH user): node.sh with node_conf's node.conf."""
    return [node_start.command("worker")]


def node_conf(cluster: str, token: bool, tracking_on: bool, metrics: bool, dashboard_host: str,
              dashboard_port: int) -> str:
    """How the cluster's nodes start Ray (infra/core/node_start.py): the users and guard, then
    Ray as Ray's user; a worker or TPU host reads Ray's TPU attributes from the metadata server
    as root first and hands them to Ray as its own variables (setup/users/gcp_tpu_env.sh)."""
    # The head's own address: Ray's updater sets RAY_HEAD_IP for workers only.
    head_env = (shell.before(shell.Shell('rf_ip="$(hostname -I | awk \'{print $1}\')"'))
                + _node_env("$rf_ip", token, tracking_on)
                + (metrics_remote.node_env_words() if metrics else "") + "RAY_USAGE_STATS_ENABLED=0")
    head_args = (f"--port={GCS_PORT} --object-manager-port=8076 --dashboard-host={dashboard_host} "
                 f"--dashboard-port={int(dashboard_port)} --disable-usage-stats")
    worker = node_start.Role(
        "Workers and TPU hosts: Ray's TPU attributes first (its own variables), then Ray.",
        privilege.user_files(privilege.ray_files(tracking_on)),
        f". ./{TPU_ENV_FILE} && {_node_env('$RAY_HEAD_IP', token, tracking_on)}"
        "RAY_USAGE_STATS_ENABLED=0",
        f"--address=$RAY_HEAD_IP:{GCS_PORT} --object-manager-port=8076 --disable-usage-stats")
    # The monitor syncs the installer to each new worker, as Ray's file mounts name it.
    head = node_start.ray_up_head(head_env, head_args, tracking_on, scaler_files=(SETUP_DIR,))
    return node_start.conf(cluster, "infra/providers/gcp_tpu/users.py (node_conf)",
                           {"head": head, "worker": worker}, private=".rayfleet",
                           guard=METADATA, tpu_env=TPU_ENV_FILE)


def file_mounts(cluster: str) -> dict[str, str]:
    """The node users' scripts (users.sh, guard.sh, gcp_tpu_env.sh, node.sh, ray.sh) and the
    cluster's node.conf, as `up` stages them, as a file mount on every node."""
    return {f"~/{privilege.USERS_DIR}": str(paths.rendered_dir(cluster) / node_start.STAGED)}

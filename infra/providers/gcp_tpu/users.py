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

from infra.core import privilege
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
#: Ray's file mounts keep modes; this keeps the SSH user's copies of the token and password
#: private even if they came without (users.sh copies them with the mode they have).
_PRIVATE = shell.group(shell.first_of(
    shell.argv("chmod", "-R", "go-rwx", shell.home("~/.rayfleet")) + " 2>/dev/null", "true"))


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
    """The head's start commands (run by `ray up` over SSH as the SSH user)."""
    # The head's own address: Ray's updater sets RAY_HEAD_IP for workers only.
    env = (shell.before(shell.Shell('rf_ip="$(hostname -I | awk \'{print $1}\')"'))
           + _node_env("$rf_ip", token, tracking_on)
           + (metrics_remote.node_env_words() if metrics else "") + "RAY_USAGE_STATS_ENABLED=0 ")
    args = (f"--port={GCS_PORT} --object-manager-port=8076 --dashboard-host={dashboard_host} "
            f"--dashboard-port={int(dashboard_port)} --disable-usage-stats")
    return [_PRIVATE, *privilege.ray_up_head_start(
        "", env, args, GCS_PORT, token, tracking_on,
        # The monitor syncs the installer to each new worker, as Ray's file mounts name it.
        scaler_files=(SETUP_DIR,), before_ray=(privilege.guard(*METADATA),))]


def worker_start(token: bool, tracking_on: bool) -> list[str]:
    """A worker's or TPU host's start commands (run by the head's autoscaler over SSH as the SSH
    user; Ray's updater opens one session per command, so what the second needs is in it)."""
    env = _node_env("$RAY_HEAD_IP", token, tracking_on)
    return [
        shell.all_of(_PRIVATE, privilege.setup_users(privilege.ray_files(tracking_on)),
                     privilege.guard(*METADATA), privilege.stop_ray()),
        # Ray's TPU attributes, read as root (the guard lets root through), into Ray's user's
        # home as Ray's own variables, which its `ray start` then reads before the server.
        shell.all_of(
            privilege.AS_ROOT + shell.argv("bash", shell.home(f"~/{TPU_ENV_SCRIPT}")) + " | "
            + privilege.ray_script("sh", shell.quoted(f"cat > {shell.word(TPU_ENV_FILE)}")),
            privilege.start_ray(
                shell.all_of(shell.argv(".", f"./{TPU_ENV_FILE}"),
                             f"{env}RAY_USAGE_STATS_ENABLED=0"),
                f"--address=$RAY_HEAD_IP:{GCS_PORT} --object-manager-port=8076 "
                "--disable-usage-stats")),
    ]


def file_mounts() -> dict[str, str]:
    """The installers (users.sh, guard.sh, gcp_tpu_env.sh) as a file mount on every node."""
    return {f"~/{privilege.USERS_DIR}": str(privilege.SCRIPTS_SOURCE)}

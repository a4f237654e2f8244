"""Who runs what on a cloud node: Ray as an unprivileged user, its autoscaler as a second one.

On Lambda's and Google's images the SSH user has passwordless sudo, so whatever runs as it can
become root. rayfleet therefore keeps the SSH user for its own control steps only and, through
setup/users/users.sh (run once per node, with sudo), makes system users of its own:

- `RAY_USER` runs Ray: head, workers, and so every job, task, actor and Serve replica. No sudo,
  no admin group, its own 0700 home holding the cluster's Ray token (and tracking password).
- `SCALER_USER` runs Ray's autoscaler apart from the head's other processes (`ray start --head
  --no-monitor`, then Ray's monitor as this user, under the head's one supervisor). Its 0700
  home holds the cloud credential, the cluster's SSH private key and the autoscaler's config.
- `GATEWAY_USER` runs a shared cluster's sharing gateway on a cloud head: no sudo, no login shell,
  no SSH key, in no group but its own. Its 0700 home holds the gateway's certificate, key and
  data, and its own copy of the Ray token (the gateway forwards with it), which neither Ray's user
  nor any job can read or change. The SSH user reaches those files only through sudo (users.sh
  writes them as this user; `as_user` reads them).

This module spells those steps as shell for the node's SSH user; the providers put them into
their start commands. Nothing secret is in any of them: secrets travel as 0600 files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from infra.core import auth, paths
from infra.node import raycli, shell
from infra.node import tracking as node_tracking

RAY_USER = "rayfleet-ray"
SCALER_USER = "rayfleet-scaler"
GATEWAY_USER = "rayfleet-gateway"
#: Each node user as users.sh names it in its `USER:PATH` arguments.
_USERS_SH_NAMES = {RAY_USER: "ray", SCALER_USER: "scaler", GATEWAY_USER: "gateway"}
#: setup/users/ on a node, relative to the SSH user's home (a folder: Ray's file mounts of single
#: files print a warning on stdout, which would break `invoke plan --json`).
USERS_DIR = "rayfleet/users"
#: setup/users/users.sh on a node, relative to the SSH user's home.
USERS_SCRIPT = f"{USERS_DIR}/users.sh"
#: setup/users/ray.sh on a node: Ray's CLI as Ray's user (raycli where proven, PASSED_ON kept).
RAY_SCRIPT = f"{USERS_DIR}/ray.sh"
#: setup/users/guard.sh on a node (addresses only root and the autoscaler's user may open).
GUARD_SCRIPT = f"{USERS_DIR}/guard.sh"
#: The installer's folder (setup/users/) as shipped: a file mount, or one SFTP upload per file.
SCRIPTS_SOURCE = Path(paths.setup_dir()) / "users"
#: The Ray token, relative to a node's SSH user's home: Ray's user needs it for `ray start`.
TOKEN_FILE = auth.NODE_TOKEN_PATH.removeprefix("~/")
#: The tracking server's password, relative to a node's SSH user's home (`tracking: mlflow`).
PASSWORD_FILE = node_tracking.NODE_PASSWORD_PATH.removeprefix("~/")
#: Where the autoscaler writes its logs, relative to its user's home (Ray's session log dir
#: belongs to the Ray user, whom the autoscaler must not share a writable directory with).
SCALER_LOGS = "rayfleet/logs"
SCALER_TMP = "rayfleet/tmp"
#: The pid file of Ray's autoscaler's supervisor (start_monitor; infra/node/supervise.py's JSON,
#: supervisor and monitor by pid and start time), relative to its user's home: what removes the
#: cluster stops both first (`supervise stop`), so that it launches no replacement for a worker
#: being deleted and no supervisor starts the monitor again.
MONITOR_PID = f"{SCALER_LOGS}/monitor.pid"
#: The autoscaler's logs on a head, for a root shell (its home is 0700: `AS_ROOT sh -c ...`).
MONITOR_LOGS = f"~{SCALER_USER}/{SCALER_LOGS}/monitor.*"

#: `sudo -n ` for an SSH user that is not root; nothing for root (which may have no sudo at all).
AS_ROOT = '$([ "$(id -u)" = 0 ] || echo sudo -n) '

#: Variables that Ray's launcher exports to the start commands it runs on a node, which Ray's
#: `ray start` must still see after the switch to another user (sudo resets the environment; the
#: Ray-documented knobs ride along so that a cluster tuned by them stays tuned). RAY_SCRIPT keeps
#: the same (tests/node/test_ray_script.py checks the two lists agree).
PASSED_ON = ("RAY_HEAD_IP", "RAY_OVERRIDE_RESOURCES", "RAY_OVERRIDE_LABELS",
             "RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME", "RAY_enable_autoscaler_v2",
             "RAY_USAGE_STATS_ENABLED", "AUTOSCALER_UPDATE_INTERVAL_S",
             "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S")


def as_user(user: str, command: str, activate: str = "") -> str:
    """Shell that runs `command` (bash syntax, `$HOME` = the user's home) as `user`, from the
    user's home, with the SSH user's PATH after `activate` (where `ray` and Python are).

    `runuser` keeps the caller's environment (root's case); under sudo only PATH and PASSED_ON
    survive. The command is one quoted argument to the user's bash, so values it reads from files
    (`$(cat ...)`) appear in no process's argv."""
    # ${NAME+NAME="$NAME"}: passed on only when set, as it was.
    passed = shell.Shell(" ".join(f'${{{name}+{name}="${name}"}}' for name in PASSED_ON))
    return activate + AS_ROOT + shell.argv(
        "runuser", "-u", user, "--", "env", shell.Shell('PATH="$PATH"'), passed,
        "bash", "-c", shell.quoted(shell.all_of("cd ~", command)))


def ray_files(tracking: bool) -> tuple[str, ...]:
    """What Ray's user needs of the SSH user's files: the token, and the tracking password when
    the cluster has a tracking server (`ray start` reads both)."""
    return (TOKEN_FILE, PASSWORD_FILE) if tracking else (TOKEN_FILE,)


def setup_users(ray_files: Sequence[str], scaler_files: Sequence[str] = (),
                moved: Sequence[str] = (), source: str = "~") -> str:
    """Shell that makes the node's users and hands each its files (paths relative to `source`,
    the SSH user's home unless a folder in it is given; setup/users.sh copies them to the same
    places in the user's home with their modes, and is itself `USERS_SCRIPT` under `source`).
    `moved`: files handed over that then leave `source` (a credential whose only copy on the
    node must be its user's)."""
    return _users_sh(user_files(ray_files, scaler_files), moved, source)


def user_files(ray_files: Sequence[str], scaler_files: Sequence[str] = ()) -> list[str]:
    """users.sh's `USER:PATH` arguments: Ray's user's files, then the autoscaler's user's."""
    return [f"ray:{p}" for p in ray_files] + [f"scaler:{p}" for p in scaler_files]


def _users_sh(args: Sequence[str], moved: Sequence[str], source: str = "~") -> str:
    """setup/users/users.sh with its `USER:PATH` arguments, then the `moved` files removed."""
    handed = AS_ROOT + shell.argv("bash", shell.home(f"{source}/{USERS_SCRIPT}"),
                                  shell.home(source), *args)
    return shell.all_of(handed,
                        *(shell.argv("rm", "-f", shell.home(f"{source}/{p}")) for p in moved))


def hand_over(user: str, paths: Sequence[str], moved: Sequence[str] = ()) -> str:
    """Shell that gives `user` (RAY_USER, SCALER_USER or GATEWAY_USER) its own copies of the SSH
    user's files `paths` (relative to both homes), as setup_users does; secrets keep their 0600.
    `moved`: those whose SSH user's copy then goes."""
    name = _USERS_SH_NAMES.get(user)
    if name is None:
        raise ValueError(f"no node user {user!r}: expected one of {', '.join(_USERS_SH_NAMES)}")
    return _users_sh([f"{name}:{p}" for p in paths], moved)


def guard(*addresses: str) -> str:
    """Shell that lets only root and the autoscaler's user open connections to `addresses` (IPs
    or names, resolved on the node), from now on (setup/users/guard.sh; idempotent). The SSH
    user is refused too: whatever of ours needs those addresses runs as the autoscaler's user."""
    return AS_ROOT + shell.argv("bash", shell.home(f"~/{GUARD_SCRIPT}"), *addresses)


def ray_script(*args: str, activate: str = "", source: str = "~") -> str:
    """Shell that runs RAY_SCRIPT (under `source`, the SSH user's home unless a folder in it is
    given) with `args`, words of our own, after `activate` (where `ray` is)."""
    return activate + " ".join((shell.argv("bash", shell.home(f"{source}/{RAY_SCRIPT}")), *args))


def stop_ray(activate: str = "", source: str = "~") -> str:
    """`ray stop` as Ray's user (only root or Ray's user can stop its processes), when that user
    runs anything: on a fresh node (every autoscaled worker) there is nothing to stop, and `ray
    stop` imports Ray, seconds of CPU on the worker's way to joining (the scale-up bench); nor is
    the node env activated for it then."""
    stop = ray_script("stop", activate=activate, source=source)
    return f"if {shell.argv('pgrep', '-u', RAY_USER)} >/dev/null 2>&1; then {stop}; fi"


def start_monitor(gcs_address: str, config: str, node_zip: str, env: dict[str, str],
                  activate: str = "", v2: bool = True, replace: bool = True) -> str:
    """Shell that runs Ray's autoscaler as SCALER_USER under the head's one supervisor
    (infra/node/supervise.py): a monitor that dies (Ray's exits on some startup errors and on
    AuthenticationError; `kill -9`; the OOM killer) is back within seconds, since a dead
    autoscaler leaves workers running (cost) or demands pending forever.

    `replace`: stop the supervised monitor that runs (a new Ray on the head, a new config or node
    package), then start one; otherwise only start one when none runs (`up` of a running
    cluster: a supervisor that was itself killed comes back). One monitor per head, always.

    `config` and `node_zip` (the node package, for the supervisor and, on Lambda, our node
    provider) are relative to that user's home. The monitor is the module that `ray start
    --head` would run itself (ray/_private/services.py start_monitor), with the same arguments
    bar the log directory."""
    module = "ray.autoscaler.v2.monitor" if v2 else "ray.autoscaler._private.monitor"
    pid = shell.home(f"~/{MONITOR_PID}")
    python = shell.Shell('"$rf_py"')
    # A monitor from before supervision left a bare pid there (supervise reads it as nothing):
    # stopped by it while that pid is still Ray's autoscaler.
    bare = (f'rf_old=$(cat {pid} 2>/dev/null); case "$rf_old" in ""|*[!0-9]*) ;; '
            '*) grep -qs ray.autoscaler "/proc/$rf_old/cmdline" && kill "$rf_old";; esac; true')
    supervise = (python, "-m", "infra.node.supervise")
    # TMPDIR: Ray's libraries keep files under <TMPDIR>/ray (e.g. the on-prem provider's
    # cluster state), and /tmp/ray belongs to Ray's user. Exported: the supervisor and every
    # monitor it starts inherit them. `env`'s values are words (shell.home for one in $HOME).
    inner = shell.all_of(
        shell.argv("mkdir", "-p", shell.home(f"~/{SCALER_LOGS}"), shell.home(f"~/{SCALER_TMP}")),
        shell.Shell(f"rf_py={raycli.PYTHON}"),
        shell.export({"TMPDIR": shell.home(f"~/{SCALER_TMP}"), **env,
                      "PYTHONPATH": shell.home(f"~/{node_zip}")}),
        shell.group(bare),
        shell.group(f"{shell.argv(*supervise, 'stop', '--pidfile', pid)} >/dev/null; true")
        if replace else None,
        shell.argv(*supervise, "ensure", "--pidfile", pid,
                   "--log", shell.home(f"~/{SCALER_LOGS}/monitor.out"), "--",
                   python, "-u", "-m", module, f"--gcs-address={gcs_address}",
                   shell.Shell("--autoscaling-config=" + shell.home(f"~/{config}")),
                   # As `ray start` gives it: the monitor then exports the autoscaler's metrics
                   # (nodes by type, pending demand) where the head's Prometheus finds them.
                   f"--monitor-ip={gcs_address.rsplit(':', 1)[0]}",
                   shell.Shell("--logs-dir=" + shell.home(f"~/{SCALER_LOGS}"))))
    return as_user(SCALER_USER, inner, activate)


#: What `ray up` leaves in the SSH user's home on a head, for its autoscaler: Ray's copy of the
#: cluster config and the cluster's private key.
RAY_UP_SCALER_FILES = ("ray_bootstrap_config.yaml", "ray_bootstrap_key.pem")


def ray_up_monitor(gcs_port: int, token: bool, node_zip: str, activate: str = "",
                   replace: bool = True) -> str:
    """Shell that runs Ray's v1 monitor, supervised, as the autoscaler's user on a head that
    `ray up` started (node_start.ray_up_head), with `ray up`'s config and key, starting and stopping
    the workers."""
    auth_env = ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": shell.home(f"~/{TOKEN_FILE}")}
                if token else {"RAY_AUTH_MODE": "disabled"})
    return start_monitor(f"127.0.0.1:{gcs_port}", RAY_UP_SCALER_FILES[0], node_zip, auth_env,
                         activate, v2=False, replace=replace)


def job_reach(credential: str, scaler_runs: str = "the autoscaler and the idle watcher") -> str:
    """The one line `plan` and `status` print about what a job on such a node can reach
    (`scaler_runs`: what of ours runs as the autoscaler's user, the one that reaches
    `credential`)."""
    return (f"jobs run as {RAY_USER} (no sudo): they reach Ray and the cluster's network, not "
            f"{credential}, the cluster's SSH key or root; {scaler_runs} run as {SCALER_USER}")

"""The two users of a Lambda node (infra/core/privilege.py): which files each gets, and the start
commands of an autoscaling cluster's head and workers run as them.

The head: the SSH user receives everything over SFTP (autoscale.bootstrap), then setup/users/users.sh
hands Ray's user the Ray token (and tracking password) and the autoscaler's user the API key, the
cluster's SSH key, the token, the config, the node package and the worker kit; `ray start --head
--no-monitor` runs as Ray's user and Ray's v2 monitor as the autoscaler's, under the head's one
supervisor. Workers: the
autoscaler sets them up over SSH as the SSH user (file mounts, setup), and their Ray runs as Ray's
user with the token handed over the same way. NOTES.md says why.
"""

from __future__ import annotations

from infra.core import node_start, privilege
from infra.node import shell

#: What `plan` and `status` print about a job on a Lambda cluster.
JOB_REACH = privilege.job_reach("the Lambda API key")
#: The Ray token, relative to a node's SSH user's home: Ray's user needs it for `ray start`.
TOKEN_FILE = privilege.TOKEN_FILE
#: What Ray's user needs of the SSH user's files (the token, the tracking password).
ray_files = privilege.ray_files


def scaler_files(key_file: str, bootstrap_key: str, config_file: str, node_dir: str,
                 tracking: bool) -> tuple[str, ...]:
    """The head's files that the autoscaler's user gets: the credential, the cluster's private
    key, the Ray token (to talk to GCS), the tracking password, the worker kit (the file mount
    for new workers), its config, the node package with our node provider, and the installer."""
    return (key_file, bootstrap_key, *ray_files(tracking), WORKER_KIT, config_file, node_dir,
            privilege.USERS_DIR)


def head_start(activate: str, ray_env: str, ray_start_args: str, scaler: tuple[str, ...],
               monitor: str, tracking: bool, moved: tuple[str, ...] = ()) -> str:
    """The autoscaling head's start (node.sh, with `head_role`'s node.conf), then `monitor` (the
    autoscaler as its user, supervised: privilege.start_monitor). The arguments are those of
    `head_role`, which the start line no longer carries (the bench's baseline still takes them)."""
    return shell.all_of(node_start.command("head"), monitor)


def head_role(ray_env: str, ray_start_args: str, scaler: tuple[str, ...], tracking: bool,
              moved: tuple[str, ...] = ()) -> node_start.Role:
    """Users and files, then Ray as Ray's user (no monitor of its own). `ray_env` are `VAR=value `
    words for `ray start`; nothing secret is in any argument. `moved`: the scaler's files whose
    SSH user's copy goes once handed over (the API key)."""
    return node_start.Role(
        "The head: Ray without its own autoscaler (Ray's v2 monitor runs apart).",
        privilege.user_files(ray_files(tracking), scaler), ray_env,
        f"--head --no-monitor {ray_start_args}", moved)


#: A worker's files, in one folder of the autoscaler's home that reaches each worker as one file
#: mount: the users' installer at `privilege.USERS_SCRIPT` under it, the Ray token and tracking
#: password at their places in a home, and the node environments' installer (autoscale.KIT_SETUP).
#: Ray's updater pays an SSH `mkdir` and an rsync per mount (0.6 s each at load 0.5) on every
#: worker's way to joining (issue 38's scale-up).
WORKER_KIT = "rayfleet/worker"


def worker_start(activate: str, ray_env: str, gcs_port: int, extra: str,
                 tracking: bool, kit: bool = False) -> list[str]:
    """A worker's start command (run by the autoscaler over SSH as the SSH user): node.sh with
    `worker_role`'s node.conf that the file mounts brought (`kit`: in `WORKER_KIT`, else at its
    place in the SSH user's home). One command: Ray's updater opens an SSH session and a login
    shell per command, all on a new worker's way to joining (issue 38's scale-up)."""
    return [node_start.command("worker", f"~/{WORKER_KIT}" if kit else "~")]


def worker_role(ray_env: str, gcs_port: int, extra: str, tracking: bool) -> node_start.Role:
    """A worker's Ray user with the token and password that the file mounts brought, then Ray as
    that user, joining the head by the address Ray's launcher substitutes."""
    return node_start.Role(
        "Each worker: Ray joins the head at the address Ray's launcher passes.",
        privilege.user_files(ray_files(tracking)), f"{ray_env}RAY_USAGE_STATS_ENABLED=0",
        f"--address=$RAY_HEAD_IP:{gcs_port} --disable-usage-stats{extra}")


def kit_files(token: bytes | None, password: bytes | None,
              conf: str) -> dict[str, tuple[bytes, int]]:
    """`WORKER_KIT`'s files (home-relative path -> (content, mode)), as `up` puts them on the
    head: the start scripts with the cluster's node.conf, the token and the tracking password
    (0600) when the cluster has them."""
    files = node_start.files(conf, WORKER_KIT)
    private = {TOKEN_FILE: token, privilege.PASSWORD_FILE: password}
    files.update({f"{WORKER_KIT}/{path}": (data, 0o600)
                  for path, data in private.items() if data is not None})
    return files


def kit_mount() -> dict[str, str]:
    """`WORKER_KIT` as one file mount: from the autoscaler's home on the head to each worker."""
    return {f"~/{WORKER_KIT}": f"~/{WORKER_KIT}"}


#: What `ray up` leaves in the SSH user's home on the head of a fixed-size cluster, for its
#: autoscaler: Ray's copy of the cluster config and the cluster's private key.
FIXED_SCALER_FILES = privilege.RAY_UP_SCALER_FILES


def fixed_head_start() -> list[str]:
    """A fixed-size cluster's head (`ray up` of Ray's on-prem provider): node.sh with
    `fixed_head_role`'s node.conf. After `ray up`, Ray's v1 monitor runs as the autoscaler's user
    with `ray up`'s config and key, starting the workers over SSH
    (remote_head.start_ray_up_monitor, as GCP's heads)."""
    return [node_start.command("head")]


def fixed_head_role(ray_env: str, ray_start_args: str, tracking: bool) -> node_start.Role:
    """What `fixed_head_start`'s node.sh does: node_start.ray_up_head."""
    return node_start.ray_up_head(ray_env, ray_start_args, tracking)

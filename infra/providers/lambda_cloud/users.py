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

from pathlib import Path

from infra.core import paths, privilege
from infra.node import shell

#: What `plan` and `status` print about a job on a Lambda cluster.
JOB_REACH = privilege.job_reach("the Lambda API key")
#: The Ray token, relative to a node's SSH user's home: Ray's user needs it for `ray start`.
TOKEN_FILE = privilege.TOKEN_FILE
#: What Ray's user needs of the SSH user's files (the token, the tracking password).
ray_files = privilege.ray_files
#: The installer (setup/users/users.sh) as shipped, and where it lands on a node.
SCRIPT_SOURCE = Path(paths.setup_dir()) / "users" / "users.sh"
#: Ray's CLI as Ray's user (setup/users/ray.sh), shipped beside it.
RAY_SCRIPT_SOURCE = SCRIPT_SOURCE.with_name("ray.sh")


def scaler_files(key_file: str, bootstrap_key: str, config_file: str, node_dir: str,
                 tracking: bool) -> tuple[str, ...]:
    """The head's files that the autoscaler's user gets: the credential, the cluster's private
    key, the Ray token (to talk to GCS), the tracking password, the worker kit (the file mount
    for new workers), its config, the node package with our node provider, and the installer."""
    return (key_file, bootstrap_key, *ray_files(tracking), WORKER_KIT, config_file, node_dir,
            privilege.USERS_DIR)


def head_start(activate: str, ray_env: str, ray_start_args: str, scaler: tuple[str, ...],
               monitor: str, tracking: bool, moved: tuple[str, ...] = ()) -> str:
    """Users and files, then Ray as Ray's user (no monitor of its own), then `monitor` (the
    autoscaler as its user, supervised: privilege.start_monitor). `ray_env` are `VAR=value `
    words for `ray start`; nothing secret is in any argument. `moved`: the scaler's files whose
    SSH user's copy goes once handed over (the API key)."""
    return shell.all_of(
        privilege.setup_users(ray_files(tracking), scaler, moved),
        privilege.stop_ray(activate),
        privilege.start_ray(ray_env, f"--head --no-monitor {ray_start_args}", activate),
        monitor,
    )


#: A worker's files, in one folder of the autoscaler's home that reaches each worker as one file
#: mount: the users' installer at `privilege.USERS_SCRIPT` under it, the Ray token and tracking
#: password at their places in a home, and the node environments' installer (autoscale.KIT_SETUP).
#: Ray's updater pays an SSH `mkdir` and an rsync per mount (0.6 s each at load 0.5) on every
#: worker's way to joining (issue 38's scale-up).
WORKER_KIT = "rayfleet/worker"


def worker_start(activate: str, ray_env: str, gcs_port: int, extra: str,
                 tracking: bool, kit: bool = False) -> list[str]:
    """A worker's start commands (run by the autoscaler over SSH as the SSH user): its Ray user
    with the token and password that the file mounts brought (`kit`: in `WORKER_KIT`, else at
    their places in the SSH user's home), then Ray as that user."""
    address = f"$RAY_HEAD_IP:{gcs_port}"
    # One command: Ray's updater opens an SSH session and a login shell per command, all on a
    # new worker's way to joining (issue 38's scale-up).
    source = f"~/{WORKER_KIT}" if kit else "~"
    return [shell.all_of(
        privilege.setup_users(ray_files(tracking), source=source),
        privilege.stop_ray(activate, source),
        privilege.start_ray(f"{ray_env}RAY_USAGE_STATS_ENABLED=0",
                            f"--address={address} --disable-usage-stats{extra}", activate, source),
    )]


def kit_files(token: bytes | None, password: bytes | None) -> dict[str, tuple[bytes, int]]:
    """`WORKER_KIT`'s files (home-relative path -> (content, mode)), as `up` puts them on the
    head: the installer, the token and the tracking password (0600) when the cluster has them."""
    files = {f"{WORKER_KIT}/{privilege.USERS_SCRIPT}": (SCRIPT_SOURCE.read_bytes(), 0o755),
             f"{WORKER_KIT}/{privilege.RAY_SCRIPT}": (RAY_SCRIPT_SOURCE.read_bytes(), 0o755)}
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


def fixed_head_start(activate: str, ray_env: str, ray_start_args: str, gcs_port: int,
                     token: bool, tracking: bool) -> list[str]:
    """A fixed-size cluster's head (`ray up` of Ray's on-prem provider): Ray as Ray's user
    without a monitor; after `ray up`, Ray's v1 monitor as the autoscaler's user with `ray up`'s
    config and key, starting the workers over SSH (remote_head.start_ray_up_monitor, as GCP's
    heads)."""
    return privilege.ray_up_head_start(activate, ray_env, ray_start_args, gcs_port, token,
                                       tracking)

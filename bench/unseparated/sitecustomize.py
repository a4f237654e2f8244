"""Bench baseline only (bench/lambda_autoscale.py --compare): Lambda's start commands as they were
before issue 29, Ray and its autoscaler both as the SSH user, so that the scale-up latency of the
separated autoscaler can be set against today's. Loaded by Python at start-up when this folder is
on PYTHONPATH, which only the bench does; nothing of rayfleet imports it."""

from __future__ import annotations

from infra.core import remote_head, shipping
from infra.providers.lambda_cloud import users
from infra.providers.lambda_cloud.autoscale import CONFIG_FILE


def _head_start(activate: str, ray_env: str, ray_start_args: str, scaler: tuple[str, ...],
                monitor: str, tracking: bool, moved: tuple[str, ...] = ()) -> str:
    # `monitor` (the separated, supervised one) is left out: `ray start --head` runs its own.
    return (f"{activate}ray stop >/dev/null 2>&1; cd ~ && {activate}AUTOSCALER_MAX_LAUNCH_BATCH=1 "
            f"PYTHONPATH=$HOME/{shipping.head_path()} {ray_env}ray start --head {ray_start_args} "
            f"--autoscaling-config=$HOME/{CONFIG_FILE}")


def _worker_start(activate: str, ray_env: str, gcs_port: int, extra: str,
                  tracking: bool, kit: bool = False) -> list[str]:
    # (`kit`: today's worker files in one mount; before issue 29 they were in the home.)
    return [f"{activate}ray stop",
            f"{activate}{ray_env}RAY_USAGE_STATS_ENABLED=0 ray start "
            f"--address=$RAY_HEAD_IP:{gcs_port} --disable-usage-stats{extra}"]


users.head_start = _head_start
users.worker_start = _worker_start


# gcp-tpu (bench/gcp_autoscale.py --compare): the template's start commands of before issue 29.
from infra.providers.gcp_tpu import users as gcp_users  # noqa: E402


def _gcp_env(head_ip: str, token: bool) -> str:
    auth = ('export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$HOME/.rayfleet/ray-token"; '
            if token else "")
    return f"ulimit -n 65536; {auth}export RAY_ADDRESS={head_ip}:6379; "


def _gcp_head_start(token: bool, tracking_on: bool, metrics: bool, dashboard_host: str,
                    dashboard_port: int) -> list[str]:
    prometheus = "export RAY_PROMETHEUS_HOST=http://127.0.0.1:9090; " if metrics else ""
    return ["ray stop", _gcp_env("\"$(hostname -I | awk '{print $1}')\"", token) + prometheus
            + "ray start --head --port=6379 --object-manager-port=8076 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml "
            f"--dashboard-host={dashboard_host} --dashboard-port={dashboard_port} "
            "--disable-usage-stats"]


def _gcp_worker_start(token: bool, tracking_on: bool) -> list[str]:
    return ["ray stop", _gcp_env("$RAY_HEAD_IP", token)
            + "ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076 "
            "--disable-usage-stats"]


def _no_separate_monitor(*args: object, **kwargs: object) -> None:
    """Before issue 29 the head's `ray start --head` ran the monitor; none starts after `ray up`."""


gcp_users.head_start = _gcp_head_start
gcp_users.worker_start = _gcp_worker_start
remote_head.start_ray_up_monitor = _no_separate_monitor

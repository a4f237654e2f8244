"""Bench baseline only (bench/lambda_autoscale.py --compare): Lambda's start commands as they were
before issue 29, Ray and its autoscaler both as the SSH user, so that the scale-up latency of the
separated autoscaler can be set against today's. Loaded by Python at start-up when this folder is
on PYTHONPATH, which only the bench does; nothing of rayfleet imports it."""

from __future__ import annotations

from infra.providers.lambda_cloud import users


def _head_start(activate: str, ray_env: str, ray_start_args: str, scaler: tuple[str, ...],
                gcs_address: str, config_file: str, node_zip: str, monitor_env: dict[str, str],
                tracking: bool, moved: tuple[str, ...] = ()) -> str:
    return (f"{activate}ray stop >/dev/null 2>&1; cd ~ && {activate}AUTOSCALER_MAX_LAUNCH_BATCH=1 "
            f"PYTHONPATH=$HOME/{node_zip} {ray_env}ray start --head {ray_start_args} "
            f"--autoscaling-config=$HOME/{config_file}")


def _worker_start(activate: str, ray_env: str, gcs_port: int, extra: str,
                  tracking: bool) -> list[str]:
    return [f"{activate}ray stop",
            f"{activate}{ray_env}RAY_USAGE_STATS_ENABLED=0 ray start "
            f"--address=$RAY_HEAD_IP:{gcs_port} --disable-usage-stats{extra}"]


users.head_start = _head_start
users.worker_start = _worker_start

"""How the `gcp-tpu` provider removes a Ray cluster: Ray's own `ray down` first (it stops Ray
cleanly), then the sweep of the Compute and TPU APIs for the cluster's labels, which is the proof
that nothing is left. provider.py holds the verbs (teardown, and `up` leaving a zone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.core import auth, paths, ui
from infra.core.errors import RayfleetError
from infra.core.state import Resource, State
from infra.node.gcp_tpu.api import Gcp
from infra.providers.gcp_tpu import config, launcher
from infra.providers.gcp_tpu.launcher import RayRunner
from infra.providers.gcp_tpu.records import Cluster

#: How long teardown waits for the APIs to show no node of the cluster.
SWEEP_TIMEOUT_S = 1200


def ray_down(ray: RayRunner, name: str, state: State, cluster: Resource[Cluster],
             key_file: str | None) -> None:
    """Ray's own teardown first (it stops Ray cleanly); the label sweep after it is the proof."""
    config_path = Path(cluster.attrs.config or "")
    if not cluster.attrs.config or not config_path.exists():
        ui.warn(f"{config_path} is gone; skipping `ray down`, the API sweep removes the nodes")
        return
    log = paths.home() / "logs" / name / "ray-down.log"
    try:
        with ui.step(f"ray down (log: {log})") as step:
            code = ray(launcher.down_args(config_path),
                             launcher.ray_env(key_file, auth.client_env(state)), log,
                             step.detail)
            if code != 0:
                raise launcher.failure("down", code, log)
    except RayfleetError as exc:
        ui.warn(f"{exc}; continuing with the API sweep")
    finally:
        launcher.remove_config_caches(name, str(cluster.attrs.project))



def sweep(api: Gcp, state: State, cluster: Resource[Cluster]) -> None:
    """Delete every Compute instance and TPU node with the cluster's labels, until the APIs
    list none; only then forget the cluster."""
    zone = cluster.attrs.zone
    labels = config.sweep_labels((cluster.attrs.label_id or cluster.id), cluster.id)
    pending: dict[str, dict[str, Any]] = {}

    def check(step: ui.Step) -> bool | None:
        for name, operation in list(pending.items()):
            if api.poll(operation, f"deleting {name}") is not None:
                del pending[name]
        if pending:
            step.detail(f"deleting {', '.join(sorted(pending))}")
            return None
        instances = api.instances(zone, labels)
        nodes = api.tpu_nodes(zone, labels)
        if not instances and not nodes:
            return True
        for node in nodes:
            short = node["name"].rsplit("/", 1)[-1]
            if node.get("state") != "DELETING":
                started = api.delete_tpu_node(node["name"])
                if started is not None:
                    pending[short] = started
        for instance in instances:
            # A TPU VM's own Compute instance goes with its TPU node; it cannot be deleted.
            if "tpu_cores" in instance.get("labels", {}):
                continue
            if instance.get("status") != "STOPPING":
                started = api.delete_instance(zone, instance["name"])
                if started is not None:
                    pending[instance["name"]] = started
        left = [i["name"] for i in instances] + [n["name"].rsplit("/", 1)[-1] for n in nodes]
        step.detail(f"{len(left)} left: {', '.join(sorted(left)[:4])}")
        return None

    ui.wait_for(check, f"no VM or TPU of {cluster.id!r} left in {cluster.attrs.project}/"
                       f"{zone}", timeout=SWEEP_TIMEOUT_S, interval=api.options.poll_interval)
    state.remove(Cluster, cluster.id)

"""Spec -> Ray cluster YAML for Ray's `gcp` provider, checked with Ray's own code.

`render_cluster_yaml` supplies every variable of templates/gcp-tpu.yaml.j2; `check_with_ray` runs
Ray's offline preparation, resource fill-in and schema validation, then Ray's own TPU node-type
classification, so a config that `ray up` would read differently from what we meant never leaves
this module.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from infra.core import auth, paths, render, versions
from infra.core.metrics import remote as metrics_remote
from infra.core.render import RenderError
from infra.core.tracking import client as tracking
from infra.core.tracking import remote as tracking_remote
from infra.node import identity
from infra.providers.gcp_tpu import users
from infra.providers.gcp_tpu.spec import Spec

TEMPLATE = "gcp-tpu.yaml.j2"
FILE_NAME = "ray-cluster.yaml"
#: Our label on every node, holding the cluster id (state.cluster_id); with Ray's own
#: `ray-cluster-name` it is what teardown sweeps by. Nodes from before cluster ids carry the name.
CLUSTER_LABEL = identity.TAG_CLUSTER
#: Where the cluster's Ray token lands on every node (Ray's file_mounts copy it, mode kept).
NODE_TOKEN_PATH = "~/.rayfleet/ray-token"
#: Label value standing in for the cluster id in `invoke plan` before the first `up`.
ID_PLACEHOLDER = identity.ID_PLACEHOLDER
#: Ray's label on every node it launches (ray.autoscaler.tags.TAG_RAY_CLUSTER_NAME).
RAY_CLUSTER_LABEL = "ray-cluster-name"
HEAD_TYPE = "head"


def head_tag(cluster: str) -> str:
    """Network tag on the head only: the dashboard firewall rule targets it."""
    return f"rayfleet-{cluster}-head"


def firewall_name(cluster: str) -> str:
    return f"rayfleet-{cluster}-dashboard"


def node_labels(spec: Spec, cluster_id: str, owner: str) -> dict[str, str]:
    """Every node's labels: the user's, then the cluster id, owner mark and name (ours win)."""
    return {**spec.labels, CLUSTER_LABEL: cluster_id, identity.TAG_OWNER: owner,
            identity.TAG_NAME: spec.name}


def sweep_labels(label_id: str, cluster: str) -> dict[str, str]:
    """Labels that only this cluster's nodes carry (both must match before we delete anything):
    our cluster id (`label_id`; the name for clusters from before ids) and Ray's cluster name."""
    return {CLUSTER_LABEL: label_id, RAY_CLUSTER_LABEL: cluster}


def _scheduling_compute(provisioning: str) -> dict[str, Any] | None:
    # Both kinds need automaticRestart false / TERMINATE; DELETE keeps preempted spot VMs from
    # lingering as TERMINATED instances that still bill their disks.
    if provisioning == "spot":
        return {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
    if provisioning == "preemptible":
        return {"preemptible": True, "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
    return None


def _scheduling_tpu(provisioning: str) -> dict[str, Any] | None:
    if provisioning == "spot":
        return {"spot": True}
    if provisioning == "preemptible":
        return {"preemptible": True}
    return None


def _networks(spec: Spec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(Compute networkInterfaces, TPU networkConfig): explicit, so Ray does not pick a subnet."""
    network = f"projects/{spec.project}/global/networks/{spec.network}"
    interface: dict[str, Any] = {"network": network}
    tpu_config: dict[str, Any] = {"network": network}
    if spec.subnetwork:
        subnetwork = f"projects/{spec.project}/regions/{spec.region_name}/subnetworks/{spec.subnetwork}"
        interface["subnetwork"] = subnetwork
        tpu_config["subnetwork"] = subnetwork
    # External addresses: Ray reaches the head over SSH, and nodes download their env.
    interface["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    tpu_config["enableExternalIps"] = True
    return [interface], tpu_config


def _number(value: float) -> float | int:
    """10.0 -> 10: the rendered file shows what the user wrote, whichever way YAML parsed it."""
    return int(value) if float(value).is_integer() else value


def _worker_types(spec: Spec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The spec's CPU and TPU worker types as the template lists them."""
    cpu_types = [
        {"name": name, "min_workers": t.min_workers, "max_workers": t.max_workers,
         "cpus": t.vcpus, "machine_type": t.machine_type, "disk_size_gb": t.disk_size_gb,
         "image": t.image or spec.head.image, "provisioning": t.provisioning,
         "scheduling": _scheduling_compute(t.provisioning)}
        for name, t in spec.cpu_workers.items()
    ]
    tpu_types = []
    for name, t in spec.tpu_workers.items():
        shape = t.slice
        tpu_types.append({
            "name": name, "min_workers": t.min_workers, "max_workers": t.max_workers,
            "accelerator_type": shape.accelerator_type, "topology": shape.topology,
            "config_type": shape.generation.config_type, "chips": shape.chips,
            "hosts": shape.hosts, "chips_per_host": shape.chips_per_host,
            "cpus": t.cpus or shape.host_cpus, "runtime_version": t.runtime,
            "provisioning": t.provisioning, "scheduling": _scheduling_tpu(t.provisioning),
        })
    return cpu_types, tpu_types


def _node_commands(spec: Spec, dashboard_host: str) -> dict[str, Any]:
    """What nodes run: the installers' arguments and the users' start commands (users.py)."""
    backend = spec.node_env.backend
    token, mlflow = spec.auth == "token", spec.tracking == "mlflow"
    return dict(
        install_cpu=versions.install_args("cpu", backend=backend),
        install_tpu=versions.install_args(spec.node_env.tpu_env, backend=backend),
        google_client_requirement=(
            f"google-api-python-client=={importlib.metadata.version('google-api-python-client')}"),
        # Shell built in users.py from our own words and numbers: printed as is (render.Shell).
        head_start_commands=[render.Shell(c) for c in users.head_start(
            token, mlflow, spec.metrics == "prometheus", dashboard_host, spec.dashboard.port)],
        worker_start_commands=[render.Shell(c) for c in users.worker_start(token, mlflow)],
    )


def _dashboard_host(spec: Spec) -> str:
    return "0.0.0.0" if spec.dashboard.allowed_source_ranges else "127.0.0.1"


def node_conf(spec: Spec) -> str:
    """The cluster's node.conf (users.node_conf): how its head, workers and TPU hosts start Ray."""
    return users.node_conf(spec.name, spec.auth == "token", spec.tracking == "mlflow",
                           spec.metrics == "prometheus", _dashboard_host(spec), spec.dashboard.port)


def render_cluster_yaml(spec: Spec, public_key: str, private_key_path: str,
                        cluster_id: str = ID_PLACEHOLDER, owner: str = "") -> str:
    """The Ray cluster YAML for `spec`, with this key pair for Ray's (and our) SSH logins, and
    labels carrying `cluster_id` and the `owner` mark. With token auth, the token travels as a
    file mount from its local path (never its contents: Ray copies this file to the head and logs
    it) and every `ray start` reads it from NODE_TOKEN_PATH."""
    compute_network, tpu_network = _networks(spec)
    cpu_types, tpu_types = _worker_types(spec)
    dashboard_host = _dashboard_host(spec)
    return render.render(
        TEMPLATE,
        cluster_name=spec.name,
        source=spec.source,
        max_workers=spec.max_total,
        upscaling_speed=_number(spec.upscaling_speed),
        idle_timeout_minutes=_number(spec.idle_timeout_minutes),
        project=spec.project,
        region=spec.region_name,
        zone=spec.zone,
        ssh_user=spec.ssh_user,
        private_key_path=private_key_path,
        ssh_keys=f"{spec.ssh_user}:{public_key}",
        head=spec.head.model_dump(),
        head_tag=head_tag(spec.name),
        labels=node_labels(spec, cluster_id, owner or ID_PLACEHOLDER),
        token_file=str(auth.token_path(spec.name)) if spec.auth == "token" else "",
        node_token_path=NODE_TOKEN_PATH,
        compute_network=compute_network,
        tpu_network=tpu_network,
        cpu_types=cpu_types,
        tpu_types=tpu_types,
        setup_dir=str(paths.setup_dir()),
        dashboard_host=dashboard_host,
        dashboard_port=spec.dashboard.port,
        # `tracking: mlflow`: the password travels like the token (a path here, 0600 on nodes).
        tracking_file=str(tracking.password_path(spec.name)) if spec.tracking == "mlflow" else "",
        node_tracking_path=tracking_remote.NODE_PASSWORD_PATH,
        # `metrics: prometheus`: the head's installer adds Prometheus, and the head's dashboard
        # reads it (users.py: its address).
        metrics_env=metrics_remote.NODE_ENV if spec.metrics == "prometheus" else {},
        user_mounts=users.file_mounts(spec.name),
        **_node_commands(spec, dashboard_host),
    )


def check_with_ray(text: str, source: str) -> dict[str, Any]:
    """Ray's offline checks, then Ray's TPU classification of every node type; the prepared config.

    The head must be a Compute VM (Ray cannot run a TPU head here) and each TPU type a TPU VM, as
    `ray up` and the autoscaler will decide with the same function.
    """
    from ray.autoscaler._private.gcp.config import get_node_type
    from ray.autoscaler._private.gcp.node import GCPNodeType

    prepared = render.validate_ray_cluster_config(text, source)
    for name, node_type in prepared["available_node_types"].items():
        kind = get_node_type(node_type["node_config"])
        wants_tpu = "TPU" in node_type.get("resources", {})
        if kind != (GCPNodeType.TPU if wants_tpu else GCPNodeType.COMPUTE):
            raise RenderError(f"{source}: Ray would create node type {name!r} as a "
                              f"{kind.value} node, not a {'TPU' if wants_tpu else 'Compute'} VM")
    return prepared

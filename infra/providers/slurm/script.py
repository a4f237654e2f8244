"""The batch script: everything `templates/slurm.sbatch.j2` needs, worked out from the spec."""

from __future__ import annotations

from typing import Any

from infra.core import render, shipping
from infra.core.tracking import client as tracking
from infra.node import gateway_config, metrics, rayproc
from infra.node.slurm import autodown as slurm_autodown
from infra.node.slurm import queue
from infra.providers.slurm.spec import PORT_STRIDE, GpuWorkers, Spec, WorkerType

#: The head's node type name in Ray's autoscaling config (v2 expects it in RAY_NODE_TYPE_NAME).
HEAD_TYPE = "ray.head.default"
#: What Ray's monitor on the head imports (module path of the external node provider), from the
#: node package the batch script writes into the head's private dir.
NODE_PROVIDER = "infra.node.slurm.node_provider.SlurmNodeProvider"

# Flags only a head takes; `ray start` refuses --port and --include-dashboard on workers, and the
# dashboard and client server run on the head alone.
_HEAD_ONLY = ("port", "dashboard-port", "ray-client-server-port")


#: What Slurm's nodes need of infra/node/: its own modules and slurm/. The zip rides one
#: environment string to every worker step (128 KiB at most), so other providers' node code stays out.
NODE_PACKAGES = ("slurm",)


def port_layout() -> list[tuple[str, int]]:
    """(flag name, offset from the block's base) for every port flag of `rayproc.PortBlock`."""
    layout = []
    for flag in rayproc.PortBlock(0).flags():
        name, offset = flag.removeprefix("--").split("=")
        layout.append((name, int(offset)))
    return layout


def _group_options(partition: str | None, account: str | None, qos: str | None, time_limit: str,
                   nodes: int, cpus: int, gpus: int, gpu_type: str | None, memory_mb: int | None,
                   constraint: str | None, exclusive: bool) -> list[str]:
    # Each option in sbatch's order, None where the spec leaves it to the site's default.
    options = [f"--partition={partition}" if partition else None,
               f"--account={account}" if account else None,
               f"--qos={qos}" if qos else None,
               f"--time={time_limit}", f"--nodes={nodes}", "--ntasks-per-node=1",
               f"--cpus-per-task={cpus}",
               f"--gres=gpu:{gpu_type + ':' if gpu_type else ''}{gpus}" if gpus else None,
               f"--mem={memory_mb}M" if memory_mb else None,
               f"--constraint={constraint}" if constraint else None,
               "--exclusive" if exclusive else None]
    return [option for option in options if option is not None]


def sbatch_options(spec: Spec) -> list[str]:
    """#SBATCH options of the first (or only) component: head and CPU workers."""
    return [
        # %x: the job name, unique per submission (see Provider._submit); so is the info file.
        "--output=%x.out",
        *_group_options(spec.partition, spec.account, spec.qos, spec.time_limit, spec.nodes,
                        spec.cpus_per_node, spec.gpus_per_node, spec.gpu_type,
                        spec.memory_per_node_mb, spec.constraint, spec.exclusive),
        *spec.extra_sbatch_options,
    ]


def gpu_sbatch_options(spec: Spec, group: GpuWorkers) -> list[str]:
    return _group_options(group.partition or spec.partition, spec.account, spec.qos,
                          spec.time_limit, group.nodes, group.cpus_per_node, group.gpus_per_node,
                          group.gpu_type, group.memory_per_node_mb, group.constraint,
                          spec.exclusive)


def _object_store(spec: Spec, memory_mb: int | None) -> str:
    size = spec.object_store_bytes(memory_mb)
    return str(size) if size else ""


def worker_sbatch_options(spec: Spec, worker: WorkerType) -> list[str]:
    """sbatch options of one worker job of this type (its --time is set at submission: never
    past the head's job, see node_provider.py)."""
    options = _group_options(worker.partition or spec.partition, spec.account, spec.qos,
                             "", 1, worker.cpus_per_node, worker.gpus_per_node, worker.gpu_type,
                             worker.memory_per_node_mb, worker.constraint, spec.exclusive)
    return [o for o in options if not o.startswith("--time=")] + list(spec.extra_sbatch_options)


def _ray_resources(cpus: int, gpus: int, custom: dict[str, float]) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **custom}


def autoscaling_config(spec: Spec) -> str:
    """Ray's cluster config for the head's autoscaler (templates/slurm.autoscaler.yaml.j2); the
    head's helper adds what only the running job knows."""
    return render.render(
        "slurm.autoscaler.yaml.j2", cluster=spec.name,
        max_workers=sum(w.max_workers for w in spec.worker_types.values()),
        idle_timeout_minutes=spec.idle_timeout_minutes, module=NODE_PROVIDER, head_type=HEAD_TYPE,
        head_resources=_ray_resources(spec.cpus_per_node, spec.gpus_per_node, spec.resources),
        worker_types=[{
            "name": name,
            "resources": _ray_resources(worker.cpus_per_node, worker.gpus_per_node,
                                        worker.resources),
            "labels": dict(worker.labels),
            "min_workers": worker.min_workers, "max_workers": worker.max_workers,
            "sbatch": worker_sbatch_options(spec, worker),
            "time_limit_s": queue.time_limit_seconds(worker.time_limit or spec.time_limit),
            "object_store": _object_store(spec, worker.memory_per_node_mb),
        } for name, worker in spec.worker_types.items()],
    )


def autoscaler_env(spec: Spec) -> list[tuple[str, str]]:
    """Settings of Ray's autoscaler v2 on the head (Ray's documented variables)."""
    idle_s = max(1, int(spec.idle_timeout_minutes * 60))
    settings = [
        # A reconcile (one squeue) a second: demand becomes a submitted job within ~1 s.
        ("AUTOSCALER_UPDATE_INTERVAL_S", "1"),
        # A queued worker job that no demand needs any more is cancelled after this long.
        ("RAY_AUTOSCALER_PENDING_NODE_IDLE_TIMEOUT_S", str(idle_s)),
        # A job may wait in the queue for hours: never give up on it while it is needed.
        ("RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S",
         str(queue.time_limit_seconds(spec.time_limit))),
        # One sbatch per worker, so that one failure fails one node (v2 fails whole batches).
        ("AUTOSCALER_MAX_LAUNCH_BATCH", "1"),
    ]
    # What the spec's environment.env_vars sets wins (it is exported before these).
    return [(name, value) for name, value in settings if name not in spec.environment.env_vars]


def keys_dir_shell() -> str:
    """The cluster's keys dir as the batch scripts name it (ours.token_dir, from the job's side)."""
    return "$SLURM_SUBMIT_DIR/keys/$RF_CLUSTER_ID"


def tracking_store(workdir: str, cluster: str) -> str:
    """Where the cluster's MLflow store lives: the shared work dir, per cluster name (not per
    job or cluster id), so that it survives the job and the next `up` serves the same runs."""
    return f"{workdir.rstrip('/')}/tracking/{cluster}"


def tracking_node_env() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """`infra.node.tracking.node_env` with what only the job knows left to the shell: the head's
    address and port block, and the keys dir (double-quoted in the scripts, so they expand)."""
    offset = rayproc.PortBlock(0).tracking
    plain, files = tracking.node_env(f"http://$RF_HEAD_IP:$((RF_BASE + {offset}))",
                                     f"{keys_dir_shell()}/{tracking.PASSWORD_FILE}")
    return sorted(plain.items()), sorted(files.items())


def sharing_home(workdir: str, cluster: str) -> str:
    """Where `up` puts the sharing gateway's config, certificate, key and data (members' token
    hashes, usage, audit log) for the head's job: the shared work dir, per cluster name like the
    tracking store, so that usage outlives the job and the next `up` goes on with it."""
    return f"{workdir.rstrip('/')}/sharing/{cluster}"


def metrics_store(workdir: str, cluster: str) -> str:
    """Where the cluster's Prometheus keeps its database and log: the shared work dir, per
    cluster name like the tracking store, so that the history outlives the head's job (and its
    node) and the next `up` of the cluster goes on with it."""
    return f"{workdir.rstrip('/')}/metrics/{cluster}"


def _metrics_context(spec: Spec) -> dict[str, Any]:
    on = spec.metrics == "prometheus"
    block = rayproc.PortBlock(0)
    history = spec.metrics_history
    return {
        "metrics": on,
        "metrics_config": metrics.CONFIG_FILE,
        "metrics_args": [history.days, history.size_mb, history.scrape_interval_s],
        "prometheus_offset": block.prometheus,
        # Ray's autoscaler and dashboard export their own metrics on fixed ports unless told:
        # two clusters' heads on one node would collide there.
        "metrics_ports": [("AUTOSCALER_METRIC_PORT", block.autoscaler_metrics),
                          ("DASHBOARD_METRIC_PORT", block.dashboard_metrics)] if on else [],
    }


def _environment_context(spec: Spec) -> dict[str, Any]:
    env = spec.environment
    tracking_env, tracking_files = tracking_node_env() if spec.tracking == "mlflow" else ([], [])
    return {
        "tracking_env": tracking_env,
        "tracking_files": tracking_files,
        "auth": spec.auth != "none",
        "modules": env.modules,
        "activate": env.activate,
        "env_vars": sorted(env.env_vars.items()),
        # Every node runs its helper from the node package (infra/node/slurm/node_helper.py).
        "node_zip_parts": shipping.node_zip_parts(NODE_PACKAGES),
        "node_zip_name": shipping.zip_name(NODE_PACKAGES),
        "temp_root": spec.ray_temp_root.rstrip("/") or "",
    }


def render_worker_script(spec: Spec) -> str:
    """The batch script of one autoscaled worker (templates/slurm.worker.sbatch.j2)."""
    layout = port_layout()
    return render.render(
        "slurm.worker.sbatch.j2", cluster=spec.name, **_environment_context(spec),
        worker_ports=[(n, o) for n, o in layout if n not in _HEAD_ONLY],
        ready_timeout=spec.ready_timeout_s,
    )


def render_script(spec: Spec) -> str:
    layout = port_layout()
    offsets = dict(layout)
    groups: list[dict[str, Any]] = [{
        "cpus": spec.cpus_per_node, "gpus": spec.gpus_per_node,
        "object_store": _object_store(spec, spec.memory_per_node_mb),
        "resources": spec.resources,
    }]
    gpu = spec.gpu_workers
    if gpu:
        groups.append({
            "cpus": gpu.cpus_per_node, "gpus": gpu.gpus_per_node,
            "object_store": _object_store(spec, gpu.memory_per_node_mb),
            "resources": gpu.resources,
        })
    autoscaling = spec.autoscaling
    tracking_on = spec.tracking == "mlflow"
    return render.render(
        "slurm.sbatch.j2",
        cluster=spec.name,
        sbatch_options=sbatch_options(spec),
        gpu_sbatch_options=gpu_sbatch_options(spec, gpu) if gpu else [],
        **_environment_context(spec),
        autoscaling=autoscaling,
        autodown=f"{spec.autodown.idle_minutes:g}" if spec.autodown else "",
        autodown_config=slurm_autodown.CONFIG_FILE,
        autodown_marker=slurm_autodown.MARKER_FILE,
        tracking=tracking_on,
        tracking_config=tracking.CONFIG_FILE,
        tracking_offset=rayproc.PortBlock(0).tracking,
        tracking_secrets=[tracking.PASSWORD_FILE, tracking.SECRET_KEY_FILE],
        **_metrics_context(spec),
        sharing=spec.sharing is not None,
        gateway_config=gateway_config.CONFIG_FILE,
        keys_dir=keys_dir_shell(),
        worker_script=render_worker_script(spec).rstrip("\n") if autoscaling else "",
        autoscaling_config=autoscaling_config(spec) if autoscaling else "",
        autoscaler_env=autoscaler_env(spec) if autoscaling else [],
        port_first=spec.port_range_start,
        port_stride=PORT_STRIDE,
        port_blocks=spec.port_blocks,
        gcs_offset=offsets["port"],
        dashboard_offset=offsets["dashboard-port"],
        head_ports=layout,
        worker_ports=[(n, o) for n, o in layout if n not in _HEAD_ONLY],
        ready_timeout=spec.ready_timeout_s,
        groups=groups,
    )

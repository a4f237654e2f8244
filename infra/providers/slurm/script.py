"""The batch script: everything `templates/slurm.sbatch.j2` needs, worked out from the spec."""

from __future__ import annotations

import shlex
from typing import Any

from infra import rayproc, render
from infra.providers.slurm import node_helper
from infra.providers.slurm.spec import PORT_STRIDE, GpuWorkers, Spec

# Flags only a head takes; `ray start` refuses --port and --include-dashboard on workers, and the
# dashboard and client server run on the head alone.
_HEAD_ONLY = ("port", "dashboard-port", "ray-client-server-port")


def port_layout() -> list[tuple[str, int]]:
    """(flag name, offset from the block's base) for every port flag of `rayproc.PortBlock`."""
    layout = []
    for flag in rayproc.PortBlock(0).flags():
        name, offset = flag.removeprefix("--").split("=")
        layout.append((name, int(offset)))
    return layout


def shell_path(path: str) -> str:
    """A path for a shell word: `~/x` becomes "$HOME"/x (quoting would stop `~` expanding)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _group_options(partition: str | None, account: str | None, qos: str | None, time_limit: str,
                   nodes: int, cpus: int, gpus: int, gpu_type: str | None, memory_mb: int | None,
                   constraint: str | None, exclusive: bool) -> list[str]:
    options = []
    if partition:
        options.append(f"--partition={partition}")
    if account:
        options.append(f"--account={account}")
    if qos:
        options.append(f"--qos={qos}")
    options += [f"--time={time_limit}", f"--nodes={nodes}", "--ntasks-per-node=1",
                f"--cpus-per-task={cpus}"]
    if gpus:
        options.append(f"--gres=gpu:{gpu_type + ':' if gpu_type else ''}{gpus}")
    if memory_mb:
        options.append(f"--mem={memory_mb}M")
    if constraint:
        options.append(f"--constraint={constraint}")
    if exclusive:
        options.append("--exclusive")
    return options


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
    env = spec.environment
    return render.render(
        "slurm.sbatch.j2",
        cluster=spec.name,
        sbatch_options=sbatch_options(spec),
        gpu_sbatch_options=gpu_sbatch_options(spec, gpu) if gpu else [],
        modules=env.modules,
        activate=env.activate,
        activate_path=shell_path(env.activate) if env.activate else "",
        env_vars=sorted(env.env_vars.items()),
        helper=node_helper.embedded_source().rstrip("\n"),
        port_first=spec.port_range_start,
        port_stride=PORT_STRIDE,
        port_blocks=spec.port_blocks,
        gcs_offset=offsets["port"],
        dashboard_offset=offsets["dashboard-port"],
        head_ports=layout,
        worker_ports=[(n, o) for n, o in layout if n not in _HEAD_ONLY],
        temp_root=spec.ray_temp_root.rstrip("/") or "",
        ready_timeout=spec.ready_timeout_s,
        groups=groups,
    )

"""The `slurm` section of a cluster spec: where to submit, what to allocate, how to start Ray.

Only what a spec can know offline is checked here (types, ranges, exclusive options). What depends
on the cluster (does the partition exist, does it have that many nodes) is checked by `plan`
against `sinfo`/`scontrol` before anything is submitted (see `infra/providers/slurm/cluster.py`).
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from infra.core.capabilities import Capabilities
from infra.core.spec import ClusterSpec, StrictModel, WorkerRange
from infra.node.slurm.queue import time_limit_seconds

# A word Slurm accepts as a partition, account, QOS, module or GPU type: no spaces, no quotes.
_WORD = r"^[A-Za-z0-9_.+/:@%-]+$"


def _gpu_type_needs_gpus(value: str | None, info: ValidationInfo) -> str | None:
    if value and not info.data.get("gpus_per_node"):
        raise ValueError("a GPU type needs gpus_per_node of at least 1")
    return value


#: A GPU model for `--gpus=<type>:<n>`; only meaningful next to gpus_per_node >= 1, which every
#: section that has this field declares before it (validation sees fields in order).
GpuType = Annotated[str | None, Field(pattern=_WORD), AfterValidator(_gpu_type_needs_gpus)]
#: Ports between blocks; a block (rayproc.BLOCK_SIZE ports) must fit in one stride.
PORT_STRIDE = 128


class Submit(StrictModel):
    """Where sbatch/squeue/scancel run: this machine, or a login host over SSH."""

    host: str = Field("local", pattern=r"^[A-Za-z0-9_.:-]+$")
    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_.-]*$")
    port: int = Field(22, ge=1, le=65535)
    key: str | None = None
    jump_host: str | None = Field(None, pattern=r"^(?:[a-z_][a-z0-9_.-]*@)?[A-Za-z0-9_.-]+(?::\d+)?$")
    proxy_command: str | None = None
    login_shell: bool = False
    slurm_conf: str | None = None
    workdir: str = Field("~/.rayfleet/slurm", pattern=r"^(~/|/)[A-Za-z0-9_./~-]*$")
    #: Host keys of the login/jump hosts and of the compute nodes (the dashboard tunnel ends on
    #: the head's node): the user's known_hosts unless a file is named here.
    known_hosts: str | None = None
    #: "strict": an unknown or changed host key stops; "accept-new" pins unknown ones on first
    #: contact (into known_hosts), still refusing changed ones.
    host_key_policy: Literal["strict", "accept-new"] = "strict"

    @property
    def is_local(self) -> bool:
        return self.host == "local"

    @model_validator(mode="after")
    def _ssh_options_need_a_login_host(self) -> Submit:
        if self.is_local:
            for key in ("user", "key", "jump_host", "proxy_command"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"{key} is only used with a login host; set host to its address "
                        f"or remove {key}"
                    )
            if self.login_shell:
                raise ValueError("login_shell is only used with a login host; remove it")
        if self.jump_host and self.proxy_command:
            raise ValueError("jump_host and proxy_command exclude each other; keep one")
        return self


class _NodeShape(StrictModel):
    """The hardware of one node, as both worker groups ask Slurm for it."""

    partition: str | None = Field(None, pattern=_WORD)
    cpus_per_node: int = Field(..., ge=1, le=4096)
    gpus_per_node: int = Field(0, ge=0, le=64)
    gpu_type: GpuType = None
    memory_per_node_mb: int | None = Field(None, ge=100)
    constraint: str | None = Field(None, pattern=r"^[A-Za-z0-9_.&|*\[\]():-]+$")


class GpuWorkers(_NodeShape):
    """A second group of nodes with other hardware: a heterogeneous Slurm job (`hetjob`)."""

    nodes: int = Field(1, ge=1, le=4096)
    resources: dict[str, float] = Field(default_factory=dict)


class WorkerType(_NodeShape, WorkerRange):
    """Workers Ray's autoscaler may start on demand: one sbatch job per worker node."""

    #: Walltime of each worker job; never more than what the head's job has left.
    time_limit: str | None = None
    min_workers: int = Field(0, ge=0, le=4096)
    max_workers: int = Field(1, ge=0, le=4096)
    resources: dict[str, float] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, value: str | None) -> str | None:
        return None if value is None else _check_time(value)


def _check_time(value: str) -> str:
    try:
        seconds = time_limit_seconds(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not a Slurm time; use minutes, H:MM:SS or D-HH:MM:SS"
        ) from None
    if seconds < 60:
        raise ValueError(f"{value!r} is under a minute; Ray needs longer than that to start")
    return value


class Environment(StrictModel):
    """What each node does before `ray start`: modules, an env made by setup/, variables."""

    modules: list[str] = Field(default_factory=list)
    activate: str | None = Field(None, pattern=r"^(~/|/)[A-Za-z0-9_./~+-]*$")
    install: bool = False
    kind: Literal["cpu", "gpu", "auto"] | None = None
    backend: Literal["auto", "conda", "venv"] = "auto"
    env_vars: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _install_needs_a_prefix(self) -> Environment:
        if self.install and not self.activate:
            raise ValueError("install needs activate: the prefix setup/install.sh creates")
        return self

    @field_validator("modules")
    @classmethod
    def _module_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(_WORD, name):
                raise ValueError(f"module {name!r} is not a module name (no spaces or quotes)")
        return value

    @field_validator("env_vars")
    @classmethod
    def _variable_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"{name!r} is not a shell variable name")
            if name.startswith(("RF_", "SLURM_")):
                raise ValueError(f"{name!r}: RF_* and SLURM_* are set by the job itself")
        return value


class Spec(ClusterSpec):
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        ssh=True, tracking=True, metrics=True,
        # The head's job runs the sharing gateway on its node (templates/slurm.sbatch.j2):
        # members on the site reach it there, others through their own SSH tunnel via a login
        # host. Ray runs as the owner's site account (no second user: separate_ray_user stays
        # False), so `members_run_as_owner` is required.
        sharing_gateway=True,
        # Autodown is opt-in on Slurm (`autodown: {idle_minutes: N}`, no default): a job ends at
        # its time limit anyway and is billed in node-hours of an allocation, not money, and a
        # queue wait makes an accidental removal expensive in time. Worth setting for long time
        # limits: an idle cluster then gives its nodes back early (the head's job runs the
        # watcher, see autodown.py).
        autodown_default_minutes=None,
        member_clusters_refusal="members' code runs under your own Slurm account there, so a "
                                "member's job can read another's files; isolation cannot hold")

    provider: Literal["slurm"]
    submit: Submit = Field(default_factory=Submit)
    partition: str | None = Field(None, pattern=_WORD)
    account: str | None = Field(None, pattern=_WORD)
    qos: str | None = Field(None, pattern=_WORD)
    time_limit: str = "1:00:00"
    nodes: int = Field(1, ge=1, le=4096)
    cpus_per_node: int = Field(..., ge=1, le=4096)
    gpus_per_node: int = Field(0, ge=0, le=64)
    gpu_type: GpuType = None
    memory_per_node_mb: int | None = Field(None, ge=100)
    constraint: str | None = Field(None, pattern=r"^[A-Za-z0-9_.&|*\[\]():-]+$")
    exclusive: bool = False
    extra_sbatch_options: list[str] = Field(default_factory=list)
    gpu_workers: GpuWorkers | None = None
    #: Autoscaling: worker types Ray's autoscaler submits as one sbatch job per node. Without
    #: them the cluster is one fixed job (`nodes`, `gpu_workers`).
    worker_types: dict[str, WorkerType] = Field(default_factory=dict)
    #: Minutes an autoscaled worker may sit idle before its job is cancelled.
    idle_timeout_minutes: float = Field(5.0, ge=0.05, le=7 * 24 * 60)
    environment: Environment = Field(default_factory=Environment)
    object_store_memory_mb: int | None = Field(None, ge=75)
    resources: dict[str, float] = Field(default_factory=dict)
    port_range_start: int = Field(20000, ge=1024, le=65535)
    port_blocks: int = Field(90, ge=1, le=500, validate_default=True)
    ray_temp_root: str = Field("/tmp", pattern=r"^/[A-Za-z0-9_./-]{0,29}$")
    queue_timeout_s: int = Field(3600, ge=5, le=7 * 86400)
    ready_timeout_s: int = Field(300, ge=10, le=3600)

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        return _check_time(value)

    @field_validator("worker_types")
    @classmethod
    def _type_names(cls, value: dict[str, WorkerType]) -> dict[str, WorkerType]:
        for name in value:
            if not re.fullmatch(r"^[a-z][a-z0-9_-]{0,23}$", name):
                raise ValueError(f"{name!r}: a worker type name is 1-24 lowercase letters, "
                                 "digits, - or _, starting with a letter")
        return value

    @model_validator(mode="after")
    def _no_gateway_firewall(self) -> Spec:
        # rayfleet opens no firewall on a site: ranges it cannot enforce would only look safe.
        if self.sharing is not None and self.sharing.allowed_source_ranges:
            raise ValueError("sharing.allowed_source_ranges: rayfleet controls no firewall on a "
                             "Slurm site, so it cannot limit who reaches the gateway; remove the "
                             "field (members need the site's network or an SSH login to reach it)")
        return self

    @model_validator(mode="after")
    def _autoscaling_has_one_head_node(self) -> Spec:
        if self.worker_types and self.nodes != 1:
            raise ValueError("nodes: an autoscaling cluster (worker_types) runs its head as a "
                             "one-node job; remove nodes or worker_types")
        if self.worker_types and self.gpu_workers:
            raise ValueError("gpu_workers: a fixed GPU group and worker_types exclude each "
                             "other; declare the GPU nodes as a worker type")
        return self

    @property
    def autoscaling(self) -> bool:
        return bool(self.worker_types)

    @field_validator("extra_sbatch_options")
    @classmethod
    def _long_options(cls, value: list[str]) -> list[str]:
        for option in value:
            if not re.fullmatch(r"^--[a-z][a-z-]*(=[^\s'\"\\]+)?$", option):
                raise ValueError(
                    f"{option!r} must be one long sbatch option like --mail-type=END (no spaces)"
                )
            if option.split("=")[0] in ("--job-name", "--output", "--error", "--nodes",
                                        "--ntasks-per-node", "--chdir"):
                raise ValueError(f"{option!r} is set by rayfleet; remove it")
        return value

    @field_validator("port_blocks")
    @classmethod
    def _ports_fit(cls, value: int, info: ValidationInfo) -> int:
        start = info.data.get("port_range_start", 20000)
        last = start + value * PORT_STRIDE - 1
        if last > 65535:
            raise ValueError(
                f"{value} blocks of {PORT_STRIDE} ports from port_range_start {start} end at "
                f"{last}, past 65535; lower one of them"
            )
        return value

    @property
    def total_nodes(self) -> int:
        return self.nodes + (self.gpu_workers.nodes if self.gpu_workers else 0)

    def object_store_bytes(self, memory_mb: int | None) -> int | None:
        """The object store size for a node with `memory_mb` allocated (None: Ray's default).

        Every Slurm node reports the whole machine's memory to Ray, not the job's share, so Ray's
        own default (30% of that) can exceed what the job may use: derive it from --mem instead.
        """
        if self.object_store_memory_mb:
            return self.object_store_memory_mb * 1024 * 1024
        if memory_mb:
            return max(75, memory_mb * 3 // 10) * 1024 * 1024
        return None

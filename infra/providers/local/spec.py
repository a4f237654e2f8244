"""The `local` provider's section of a cluster spec, and its capability table."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from infra.core.capabilities import Capabilities
from infra.core.spec import ClusterSpec
from infra.node import rayproc


class Spec(ClusterSpec):
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        tracking=True, metrics=True,
        # The head is this machine: `up` starts the sharing gateway beside it, on the loopback
        # only, so the sharing CA signs for nothing else.
        sharing_gateway=True, sharing_ca_ranges=("127.0.0.0/8",),
        # A laptop's cluster runs no Prometheus unless its spec says `metrics: prometheus`.
        metrics_default="none",
        # `up` replaces the gateway whose config changed; the watcher keeps the one it started.
        applied_by_up=frozenset({"sharing"}),
        # `sharing.isolation: cluster`: member users and their heads on this machine (root).
        member_clusters=True, member_clusters_need_local_root=True)

    provider: Literal["local"]
    #: CPUs Ray may schedule on; None lets Ray count the machine's cores.
    num_cpus: int | None = Field(None, ge=1, le=4096)
    num_gpus: int | None = Field(None, ge=0, le=64)
    #: Object store size; Ray needs at least 75 MiB.
    object_store_memory_mb: int | None = Field(None, ge=75)
    #: First port of the cluster's block; None derives one from the name.
    port_base: int | None = Field(None, ge=1024, le=65535 - rayproc.BLOCK_SIZE)
    #: Custom Ray resources, e.g. {"special": 2}.
    resources: dict[str, float] = Field(default_factory=dict)
    #: How long `up` waits for the dashboard to accept jobs.
    ready_timeout_s: int = Field(120, ge=5, le=3600)

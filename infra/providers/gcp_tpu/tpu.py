"""TPU facts in one place: generations, chips per host, default runtime versions, slice shapes.

Everything rayfleet derives about a TPU worker type (the `resources: {TPU: n}` Ray is told, how many
hosts a slice has, which runtime image it boots) comes from `GENERATIONS` and `resolve()`, so a
user names only an accelerator type (`v4-8`) or a type and topology (`v4`, `2x2x1`).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

#: Hosts of multi-host slices carry 4 chips in every generation (Ray assumes the same).
MULTI_HOST_CHIPS_PER_HOST = 4


@dataclass(frozen=True)
class Generation:
    """One TPU generation as the Cloud TPU API names it."""

    #: Prefix of accelerator types, e.g. "v4" in "v4-8", "v5litepod" in "v5litepod-8".
    name: str
    #: `acceleratorConfig.type` enum value, e.g. "V4", "V5LITE_POD".
    config_type: str
    #: TensorCores per chip: the number in an accelerator type counts cores, not chips.
    cores_per_chip: int
    #: Chips one host holds in a single-host slice (v5e/v6e pack up to 8; others 4).
    max_chips_per_host: int
    #: Runtime image when the spec names none (TPU API `runtimeVersions`).
    default_runtime: str
    #: vCPUs of one host by the chips on it, declared to Ray's autoscaler as `CPU` so that tasks
    #: asking for CPUs and TPUs fit (Ray measures the real count when the node starts).
    host_cpus: dict[int, int]
    #: Whether `acceleratorConfig` (type + topology) is accepted; Ray refuses it for v2/v3.
    topology_ok: bool
    #: Dimensions of a topology: 3 (e.g. 2x2x1) or 2 (e.g. 2x4).
    topology_dims: int
    #: Names people use that the API does not (`v5e`), shown as did-you-mean.
    aliases: tuple[str, ...] = ()


GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation("v2", "V2", 2, 4, "tpu-ubuntu2204-base", {4: 96}, False, 2),
        Generation("v3", "V3", 2, 4, "tpu-ubuntu2204-base", {4: 96}, False, 2),
        Generation("v4", "V4", 2, 4, "tpu-ubuntu2204-base", {4: 240}, True, 3),
        Generation("v5litepod", "V5LITE_POD", 1, 8, "v2-alpha-tpuv5-lite",
                   {1: 24, 4: 112, 8: 224}, True, 2, ("v5e", "v5lite")),
        Generation("v5p", "V5P", 2, 4, "v2-alpha-tpuv5", {4: 208}, True, 3),
        Generation("v6e", "V6E", 1, 8, "v2-alpha-tpuv6e", {1: 44, 4: 180, 8: 180}, True, 2,
                   ("trillium",)),
    )
}


class TpuShapeError(ValueError):
    """An accelerator type or topology that no TPU generation has; the message says the fix."""


@dataclass(frozen=True)
class Slice:
    """One TPU slice (one TPU node, one autoscaling unit) of a worker type."""

    generation: Generation
    #: Accelerator type as the API lists it, e.g. "v4-8" (also for type+topology specs).
    accelerator_type: str
    #: Topology when the spec gave one ("2x2x1"), else None.
    topology: str | None
    chips: int
    hosts: int
    chips_per_host: int

    @property
    def host_cpus(self) -> int:
        cpus = self.generation.host_cpus
        return cpus.get(self.chips_per_host) or max(cpus.values())

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1


def generation(name: str) -> Generation:
    """The generation for an API name ("v4") or config type ("V4"); TpuShapeError otherwise."""
    lowered = name.strip().lower()
    for g in GENERATIONS.values():
        if lowered in (g.name, g.config_type.lower()):
            return g
    for g in GENERATIONS.values():
        if lowered in g.aliases:
            raise TpuShapeError(f"TPU generation {name!r} is called {g.name!r} (type "
                                f"{g.config_type}) in the TPU API; use that")
    choices = [g.name for g in GENERATIONS.values()]
    close = difflib.get_close_matches(lowered, choices, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise TpuShapeError(f"unknown TPU generation {name!r}; {hint}choose one of {', '.join(choices)}")


def _shape(g: Generation, chips: int, what: str) -> tuple[int, int]:
    """(hosts, chips per host) of a slice of `chips` chips, or TpuShapeError."""
    if chips <= g.max_chips_per_host:
        if g.max_chips_per_host == MULTI_HOST_CHIPS_PER_HOST and chips != MULTI_HOST_CHIPS_PER_HOST:
            smallest = f"{g.name}-{MULTI_HOST_CHIPS_PER_HOST * g.cores_per_chip}"
            raise TpuShapeError(f"{what}: the smallest {g.name} slice is {smallest}")
        return 1, chips
    if chips % MULTI_HOST_CHIPS_PER_HOST:
        raise TpuShapeError(f"{what}: a multi-host {g.name} slice has a multiple of "
                            f"{MULTI_HOST_CHIPS_PER_HOST} chips")
    return chips // MULTI_HOST_CHIPS_PER_HOST, MULTI_HOST_CHIPS_PER_HOST


_TYPE = re.compile(r"^([a-z0-9]+)-(\d+)$")


def from_accelerator_type(accelerator_type: str) -> Slice:
    """`v4-8` -> Slice(v4, 4 chips, 1 host, 4 chips per host)."""
    match = _TYPE.fullmatch(accelerator_type.strip().lower())
    if not match:
        raise TpuShapeError(f"accelerator type {accelerator_type!r} should look like v4-8 or "
                            "v5litepod-8 (generation-cores)")
    prefix, cores = match.group(1), int(match.group(2))
    try:
        g = generation(prefix)
    except TpuShapeError as exc:
        alias = next((x for x in GENERATIONS.values() if prefix in x.aliases), None)
        if alias is not None:
            raise TpuShapeError(f"accelerator type {accelerator_type!r} is called "
                                f"'{alias.name}-{cores}' in the TPU API; use that") from None
        raise exc
    if prefix != g.name:  # "V4-8": the API's types are lowercase
        raise TpuShapeError(f"accelerator type {accelerator_type!r} is written "
                            f"'{g.name}-{cores}'")
    if cores < 1 or cores % g.cores_per_chip:
        raise TpuShapeError(f"accelerator type {accelerator_type!r}: the number counts TensorCores "
                            f"and {g.name} has {g.cores_per_chip} per chip")
    chips = cores // g.cores_per_chip
    hosts, per_host = _shape(g, chips, f"accelerator type {accelerator_type!r}")
    return Slice(g, f"{g.name}-{cores}", None, chips, hosts, per_host)


_TOPOLOGY = re.compile(r"^\d+(x\d+){1,2}$")


def from_topology(type_name: str, topology: str) -> Slice:
    """(`v4`, `2x2x1`) -> the same Slice as `v4-8`, remembering the topology."""
    g = generation(type_name)
    if not g.topology_ok:
        raise TpuShapeError(f"type {g.name} cannot be given as a topology (Ray supports "
                            f"acceleratorConfig from v4 on); use accelerator_type: "
                            f"{g.name}-{MULTI_HOST_CHIPS_PER_HOST * g.cores_per_chip}")
    text = topology.strip().lower()
    if not _TOPOLOGY.fullmatch(text) or len(text.split("x")) != g.topology_dims:
        example = "2x2x1" if g.topology_dims == 3 else "2x4"
        raise TpuShapeError(f"topology {topology!r}: {g.name} topologies have "
                            f"{g.topology_dims} dimensions, e.g. {example}")
    chips = math.prod(int(d) for d in text.split("x"))
    if chips < 1:
        raise TpuShapeError(f"topology {topology!r} has no chips")
    hosts, per_host = _shape(g, chips, f"topology {topology!r}")
    return Slice(g, f"{g.name}-{chips * g.cores_per_chip}", text, chips, hosts, per_host)

"""The `gcp-tpu` spec: a CPU head that runs no work, CPU and TPU worker types that autoscale.

Strict like every spec section (unknown keys are errors with a did-you-mean). Everything that can be
derived is derived, not typed: the region from the zone, vCPUs from the machine type, TPU chips per
host and runtime version from the accelerator type (see tpu.py).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from infra.core.capabilities import CLOUD_HEAD, Capabilities
from infra.core.spec import ClusterSpec, StrictModel, WorkerRange, existing_file, source_ranges
from infra.providers.gcp_tpu import tpu

#: GCP label keys and values (keys also must start with a letter); node type names become labels.
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
NODE_TYPE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
ZONE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
#: Labels rayfleet sets itself; a user label with one of these keys would break teardown's sweep.
RESERVED_LABELS = ("rayfleet-cluster", "rayfleet-owner", "rayfleet-name", "ray-cluster-name",
                   "ray-node-type", "ray-node-name", "ray-user-node-type", "ray-launch-config",
                   "ray-node-status")

Provisioning = Literal["standard", "spot", "preemptible"]

# vCPUs of shared-core machine types, whose names carry no number.
_SHARED_CORE_CPUS = {"e2-micro": 2, "e2-small": 2, "e2-medium": 2, "f1-micro": 1, "g1-small": 1}


def machine_type_cpus(machine_type: str) -> int | None:
    """vCPUs from a predefined or custom machine type name (n2-standard-8 -> 8), None if unknown."""
    if machine_type in _SHARED_CORE_CPUS:
        return _SHARED_CORE_CPUS[machine_type]
    custom = re.fullmatch(r"^[a-z0-9]+-custom-(\d+)-\d+(-ext)?$", machine_type)
    if custom:
        return int(custom.group(1))
    predefined = re.fullmatch(r"^[a-z][a-z0-9]*-[a-z]+-(\d+)(-lssd|-nolssd)?$", machine_type)
    return int(predefined.group(1)) if predefined else None


class HeadSpec(StrictModel):
    #: Compute Engine machine type of the head; it runs Ray's control plane, never tasks.
    machine_type: str = "n2-standard-4"
    disk_size_gb: int = Field(50, ge=10, le=65536)
    #: Boot image; the node installer brings Python and Ray, so a plain Ubuntu LTS is enough.
    image: str = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"


class WorkerCounts(WorkerRange):
    min_workers: int = Field(0, ge=0, le=1000)
    max_workers: int = Field(2, ge=0, le=1000)


class CpuWorkerSpec(WorkerCounts):
    machine_type: str = "n2-standard-8"
    #: vCPUs Ray is told this type has; derived from machine_type when unset.
    cpus: int | None = Field(None, ge=1, le=1024)
    disk_size_gb: int = Field(50, ge=10, le=65536)
    #: Boot image; None uses the head's.
    image: str | None = None
    #: standard (on-demand), spot, or preemptible (the older spot, at most 24 h).
    provisioning: Provisioning = "preemptible"

    @model_validator(mode="after")
    def _cpus_known(self) -> CpuWorkerSpec:
        if self.cpus is None and machine_type_cpus(self.machine_type) is None:
            raise ValueError(f"cannot tell the vCPUs of machine type {self.machine_type!r} from "
                             "its name; set cpus:")
        return self

    @property
    def vcpus(self) -> int:
        return self.cpus or machine_type_cpus(self.machine_type) or 1


class AcceleratorConfig(StrictModel):
    #: TPU generation as in the API's acceleratorConfig.type: V4, V5LITE_POD, V5P, V6E (or v4, ...).
    type: str
    #: Chip grid, e.g. 2x2x1 (v4, v5p) or 2x4 (v5e, v6e).
    topology: str


class SliceShape(StrictModel):
    """A TPU slice's shape and image, shared by autoscaled TPU types and queued slices."""

    #: e.g. v4-8, v5litepod-8, v6e-8 (generation-TensorCores); or give accelerator_config.
    accelerator_type: str | None = None
    accelerator_config: AcceleratorConfig | None = None
    #: TPU VM image; None picks the generation's default (see tpu.GENERATIONS).
    runtime_version: str | None = None
    #: vCPUs Ray is told one host has; derived from the generation when unset.
    cpus: int | None = Field(None, ge=1, le=1024)

    @model_validator(mode="after")
    def _one_shape(self) -> SliceShape:
        if (self.accelerator_type is None) == (self.accelerator_config is None):
            raise ValueError("give exactly one of accelerator_type (e.g. v4-8) or "
                             "accelerator_config ({type: V4, topology: 2x2x1})")
        try:
            self.slice  # noqa: B018  (validates the shape)
        except tpu.TpuShapeError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def slice(self) -> tpu.Slice:
        if self.accelerator_config is not None:
            return tpu.from_topology(self.accelerator_config.type, self.accelerator_config.topology)
        assert self.accelerator_type is not None
        return tpu.from_accelerator_type(self.accelerator_type)

    @property
    def runtime(self) -> str:
        return self.runtime_version or self.slice.generation.default_runtime


class TpuWorkerSpec(SliceShape, WorkerCounts):
    provisioning: Provisioning = "standard"
    max_workers: int = Field(1, ge=0, le=1000)


class QueuedSliceSpec(SliceShape):
    """TPU slices booked through Google's queue (queuedResources) and joined to the cluster by
    the head when they become ACTIVE; they are not autoscaled (teardown removes them)."""

    #: Zones to queue in, in order (a spot slice taken back is queued again in the next one);
    #: None: the cluster's zones. All in the cluster's region.
    zones: list[str] | None = None
    #: spot (cheap, can be taken back), reserved (from `reservation:`), standard (on-demand).
    provisioning: Literal["spot", "reserved", "standard"] = "standard"
    #: The reservation's name, for provisioning: reserved (a reservation lives in one zone).
    reservation: str | None = Field(None, pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
    #: Hours the request may wait in the queue before Google gives up on it (FAILED).
    valid_until_hours: float | None = Field(None, gt=0, le=720)
    #: How many such slices (one request each).
    count: int = Field(1, ge=1, le=64)

    @field_validator("zones")
    @classmethod
    def _zones(cls, zones: list[str] | None) -> list[str] | None:
        if zones is None:
            return None
        if not zones:
            raise ValueError("zones is empty; list zones like [us-central2-b] or remove zones: "
                             "to use the cluster's")
        for value in zones:
            if not ZONE.fullmatch(value):
                raise ValueError(f"{value!r} is not a zone like us-central2-b")
        if len(set(zones)) != len(zones):
            raise ValueError("a zone is listed twice; list each zone once")
        return zones

    @model_validator(mode="after")
    def _reservation(self) -> QueuedSliceSpec:
        if self.provisioning == "reserved" and not self.reservation:
            raise ValueError("provisioning: reserved needs reservation: <name> (see `gcloud "
                             "alpha compute tpus reservations list`)")
        if self.reservation and self.provisioning != "reserved":
            raise ValueError("reservation: is only used with provisioning: reserved; remove it "
                             "or set provisioning: reserved")
        if self.provisioning == "reserved" and self.zones is not None and len(self.zones) > 1:
            raise ValueError("a reservation lives in one zone; list only that zone in zones:")
        return self


class DashboardSpec(StrictModel):
    #: Port of the Ray dashboard (and job API) on the head.
    port: int = Field(8265, ge=1024, le=65535)
    #: CIDR ranges allowed to reach the dashboard directly (a firewall rule for exactly these);
    #: empty: reachable only through an SSH tunnel (`invoke dashboard`).
    allowed_source_ranges: list[str] = Field(default_factory=list)

    @field_validator("allowed_source_ranges")
    @classmethod
    def _cidrs(cls, ranges: list[str]) -> list[str]:
        return source_ranges(ranges, "the dashboard", "list your VPN or campus range, or use "
                             "`invoke dashboard` (SSH tunnel)")


class NodeEnvSpec(StrictModel):
    #: How setup/install.sh builds the env on nodes: auto, conda or venv.
    backend: Literal["auto", "conda", "venv"] = "auto"
    #: The env on TPU hosts: tpu (Ray + JAX with libtpu, downloaded once per host) or cpu (Ray
    #: and the CPU libraries only, e.g. for an image that brings its own JAX, or for machines
    #: that have the CPU env's packages and no network, like the offline test bed).
    tpu_env: Literal["tpu", "cpu"] = "tpu"


class Spec(ClusterSpec):
    #: Ray's user on every VM and TPU host is refused the metadata server (setup/users/guard.sh).
    CAPABILITIES: ClassVar[Capabilities] = CLOUD_HEAD

    provider: Literal["gcp-tpu"]
    project: str
    #: The zone everything runs in. With `zones:` (ordered, one region) it is the first listed
    #: until `up`'s pre-flight picks the first zone that offers every type (see candidate_zones).
    zone: str
    #: Zones to try in order instead of one `zone:`; all in one region.
    zones: list[str] | None = None
    #: Derived from the zone when unset (us-central2-b -> us-central2).
    region: str | None = None
    #: Service-account key file; unset uses application-default credentials. Only its path is used.
    credentials_file: str | None = None
    ssh_user: str = Field("ubuntu", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    network: str = Field("default", pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
    subnetwork: str | None = Field(None, pattern=r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
    #: Extra labels on every node (the cluster name label is always added).
    labels: dict[str, str] = Field(default_factory=dict)
    #: Minutes a worker may idle before the autoscaler removes it (fractions work: 0.2 = 12 s).
    idle_timeout_minutes: float = Field(10, gt=0, le=10080)
    upscaling_speed: float = Field(1.0, gt=0, le=100)
    #: Cap on all workers together; None is the sum of the types' max_workers.
    max_workers: int | None = Field(None, ge=0, le=10000)
    head: HeadSpec = Field(default_factory=HeadSpec)
    cpu_workers: dict[str, CpuWorkerSpec] = Field(default_factory=dict)
    tpu_workers: dict[str, TpuWorkerSpec] = Field(default_factory=dict)
    #: TPU slices requested through Google's queue, joined to the cluster when ACTIVE.
    queued_slices: dict[str, QueuedSliceSpec] = Field(default_factory=dict)
    dashboard: DashboardSpec = Field(default_factory=DashboardSpec)
    node_env: NodeEnvSpec = Field(default_factory=NodeEnvSpec)
    #: How long `up` waits for the dashboard to answer once `ray up` has finished.
    ready_timeout_s: int = Field(300, ge=30, le=3600)

    @model_validator(mode="before")
    @classmethod
    def _zone_or_zones(cls, data: Any) -> Any:
        """Exactly one of `zone:` and `zones:`; `zone` starts as the first of `zones`."""
        if not isinstance(data, dict):
            return data
        if "zone" in data and "zones" in data:
            raise ValueError("zone and zones are both set; keep zone: (one zone) or zones: "
                             "(an ordered list to fall back through), not both")
        if "zones" in data:
            zones = data["zones"]
            if not isinstance(zones, list) or not zones or not all(
                    isinstance(z, str) for z in zones):
                raise ValueError("zones must be a non-empty list of zones like [us-central2-b, "
                                 "us-central2-a]")
            return {**data, "zone": zones[0]}
        if "zone" not in data:
            raise ValueError("zone is missing; set zone: (one zone) or zones: (an ordered list)")
        return data

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not PROJECT.fullmatch(value):
            raise ValueError(f"{value!r} is not a GCP project id (6-30 lowercase letters, digits "
                             "or dashes); use the id, not the display name")
        return value

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not ZONE.fullmatch(value):
            raise ValueError(f"{value!r} is not a zone like us-central2-b")
        return value

    @field_validator("zones")
    @classmethod
    def _zones(cls, zones: list[str] | None) -> list[str] | None:
        if zones is None:
            return None
        for value in zones:
            if not ZONE.fullmatch(value):
                raise ValueError(f"{value!r} is not a zone like us-central2-b")
        if len(set(zones)) != len(zones):
            raise ValueError("a zone is listed twice; list each zone once")
        regions = sorted({z.rsplit("-", 1)[0] for z in zones})
        if len(regions) > 1:
            raise ValueError(f"zones span regions {', '.join(regions)}; list zones of one region "
                             "(the head, its autoscaler and its workers share one network region)")
        return zones

    @field_validator("credentials_file")
    @classmethod
    def _credentials_file(cls, value: str | None) -> str | None:
        path = existing_file(value, "point it at a service-account key (JSON) or remove it to use "
                             "application-default credentials")
        return None if path is None else str(path.resolve())

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if key in RESERVED_LABELS:
                raise ValueError(f"label {key!r} is set by rayfleet/Ray itself; pick another key")
            if not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(str(value)):
                raise ValueError(f"label {key!r}: {value!r} is not a valid GCP label (lowercase "
                                 "letters, digits, - and _; keys start with a letter)")
        return labels

    @field_validator("cpu_workers", "tpu_workers", "queued_slices")
    @classmethod
    def _type_names(cls, types: dict[str, object]) -> dict[str, object]:
        for name in types:
            if not NODE_TYPE.fullmatch(name) or name == "head":
                raise ValueError(f"name {name!r} must be 1-24 lowercase letters, digits or "
                                 "dashes, start with a letter, and not be 'head'")
        return types

    @model_validator(mode="after")
    def _consistent(self) -> Spec:
        derived = self.zone.rsplit("-", 1)[0]
        if self.region is not None and self.region != derived:
            raise ValueError(f"region {self.region!r} does not contain zone {self.zone!r}; "
                             f"use region: {derived} or remove region")
        both = set(self.cpu_workers) & set(self.tpu_workers)
        if both:
            raise ValueError(f"worker type {sorted(both)[0]!r} is both a CPU and a TPU type; "
                             "rename one")
        for name, queued in self.queued_slices.items():
            for zone in queued.zones or []:
                if zone.rsplit("-", 1)[0] != derived:
                    raise ValueError(f"queued_slices.{name}.zones: {zone} is not in the cluster's "
                                     f"region {derived}; list zones of {derived} (the slices "
                                     "join the head over its network)")
            if queued.provisioning == "reserved" and queued.zones is None and len(
                    self.candidate_zones) > 1:
                raise ValueError(f"queued_slices.{name}: a reservation lives in one zone; set "
                                 "zones: [<the reservation's zone>]")
        if self.max_workers is not None and self.max_workers < self.min_total:
            raise ValueError(f"max_workers ({self.max_workers}) is below the sum of min_workers "
                             f"({self.min_total}); raise it or remove it")
        return self

    @model_validator(mode="after")
    def _no_open_dashboard_without_auth(self) -> Spec:
        if self.dashboard.allowed_source_ranges and self.auth == "none":
            raise ValueError("dashboard.allowed_source_ranges with auth: none would let anyone in "
                             "those ranges run code on the cluster; remove auth: none (token "
                             "auth) or remove allowed_source_ranges (SSH tunnel only)")
        return self

    @property
    def candidate_zones(self) -> list[str]:
        """The zones `up` may use, in order: `zones:` or just `zone:`."""
        return list(self.zones) if self.zones else [self.zone]

    def slice_zones(self, name: str) -> list[str]:
        """The zones queued slice `name` may be requested in, in order."""
        return list(self.queued_slices[name].zones or self.candidate_zones)

    @property
    def region_name(self) -> str:
        return self.region or self.zone.rsplit("-", 1)[0]

    @property
    def min_total(self) -> int:
        types: list[WorkerCounts] = [*self.cpu_workers.values(), *self.tpu_workers.values()]
        return sum(t.min_workers for t in types)

    @property
    def max_total(self) -> int:
        if self.max_workers is not None:
            return self.max_workers
        types: list[WorkerCounts] = [*self.cpu_workers.values(), *self.tpu_workers.values()]
        return sum(t.max_workers for t in types)

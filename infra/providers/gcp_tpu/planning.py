"""What the `gcp-tpu` provider's `plan` works out without creating anything: pre-flight, the
zone order, and the rows and notes of what `up` would create. provider.py holds the verb.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.core.state import State
from infra.providers.base import PlannedResource
from infra.providers.gcp_tpu import config, firewall, preflight, services
from infra.providers.gcp_tpu.records import Cluster, Firewall, Queued
from infra.providers.gcp_tpu.spec import QueuedSliceSpec, Spec, TpuWorkerSpec

#: A pre-flight line that makes `invoke plan` exit 1 (and `up` refuse to start).
FAILED = "pre-flight ✗ "


@dataclass(frozen=True)
class Preflight:
    """What `plan` hands `up` (`Plan.extra`): the pre-flight report and the zone order."""

    #: Every check passed; None when pre-flight failed in `plan` (shown there as a note): `up`
    #: then runs it again and stops on the error.
    report: preflight.Report | None
    #: The zones a new cluster tries in order; `files` were rendered for the first. A running
    #: cluster stays in its recorded zone.
    zones: tuple[str, ...]


def zone_order(spec: Spec, report: preflight.Report | None) -> tuple[str, ...]:
    return tuple(report.zones) if report is not None and report.zones else (spec.zone,)


def _slices(count: str, kind: TpuWorkerSpec | QueuedSliceSpec, per_host: str = "") -> str:
    """A row's detail of TPU slices: how many, their type, chips and hosts, runtime, provisioning."""
    shape = kind.slice
    return (f"{count} × {shape.accelerator_type} ({shape.chips} chips, {shape.hosts} host(s)"
            f"{per_host}), {kind.runtime}, {kind.provisioning}")


def rows(spec: Spec, state: State | None,
         report: preflight.Report | None) -> tuple[list[PlannedResource], list[str]]:
    """What `up` would create in `spec`'s zone (existing ones marked), and the plan's notes."""
    running = bool(state and state.resources(Cluster))
    resources = [PlannedResource(
        "Compute VM: Ray head (runs no tasks)", f"ray-{spec.name}-head",
        f"{spec.head.machine_type}, {spec.head.disk_size_gb} GB disk, {spec.zone}", running)]
    for name, t in spec.cpu_workers.items():
        resources.append(PlannedResource(
            "Compute VMs: autoscaled CPU workers", name,
            f"{t.min_workers}..{t.max_workers} × {t.machine_type} ({t.vcpus} CPUs), "
            f"{t.provisioning}"))
    notes: list[str] = []
    for name, tpu_type in spec.tpu_workers.items():
        shape = tpu_type.slice
        resources.append(PlannedResource(
            "TPU VMs: autoscaled TPU workers", name,
            _slices(f"{tpu_type.min_workers}..{tpu_type.max_workers}", tpu_type,
                    f", TPU: {shape.chips_per_host} per host")))
        if shape.multi_host:
            notes.append(f"tpu_workers.{name}: a multi-host slice ({shape.hosts} hosts) scales "
                         "as one unit; Ray's autoscaler handles pods only roughly")
    for name, queued_slice in spec.queued_slices.items():
        resources.append(PlannedResource(
            "TPU VMs: queued slices (joined by the head when ACTIVE)", name,
            f"{_slices(str(queued_slice.count), queued_slice)}, "
            f"zones {', '.join(spec.slice_zones(name))}",
            bool(state and state.resources(Queued))))
    ranges = spec.dashboard.allowed_source_ranges
    if ranges:
        resources.append(PlannedResource(
            "firewall rule: dashboard", config.firewall_name(spec.name),
            f"tcp:{spec.dashboard.port} from {', '.join(ranges)} to the head only",
            bool(state and state.resources(Firewall))))
        notes.append(f"dashboard: http://<head ip>:{spec.dashboard.port} from "
                     f"{', '.join(ranges)}, and `invoke dashboard` (SSH tunnel)")
    else:
        notes.append("dashboard: reachable only through an SSH tunnel (`invoke dashboard`)")
    if spec.sharing is not None:
        resources.append(PlannedResource(
            "firewall rule: sharing gateway", firewall.gateway_name(spec.name),
            f"tcp:{spec.sharing.port} from {', '.join(spec.sharing.allowed_source_ranges)} "
            "to the head only",
            bool(state and state.find(Firewall, firewall.gateway_name(spec.name)))))
    if spec.tracking == "mlflow":
        notes.append(services.plan_note(spec))
    notes.append(f"idle workers are removed after {spec.idle_timeout_minutes:g} minutes; "
                 f"at most {spec.max_total} workers ({1 + spec.max_total} nodes with the head)")
    if spec.zones is not None:
        fallback = ([z for z in report.zones if z != spec.zone] if report
                    else [z for z in spec.candidate_zones if z != spec.zone])
        notes.append(f"zone {spec.zone} (from zones: {', '.join(spec.candidate_zones)}); if "
                     f"Google has no capacity for the head there, `up` removes what that zone "
                     f"left and moves on to {', '.join(fallback) or 'no other zone'}")
    return resources, notes


def split_checks(checks: list[str]) -> tuple[list[str], list[str]]:
    """Pre-flight's lines as (problems, notes)."""
    return ([c.removeprefix(FAILED) for c in checks if c.startswith(FAILED)],
            [c for c in checks if not c.startswith(FAILED)])

"""Pre-flight: everything `up` can learn from Google before it creates anything.

Read-only calls in the order a user would fix things: project, zone, network, machine types, TPU
API, accelerator types and runtime versions offered in the zone, then quotas for what `up` starts
at once (head + min_workers). The first problem raises a one-line GcpError naming the spec field
and the fix; things that only matter at full scale become warnings.

With `zones:` the zone checks run for every listed zone: the first zone that offers every machine
type, TPU type and runtime version is chosen, the other usable ones are kept (in order) for `up`
to fall back to when Google refuses the head for capacity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from infra.node.gcp_tpu.api import (
    Gcp,
    GcpError,
    GcpNotFoundError,
    GcpPermissionError,
    GcpQuotaError,
)
from infra.providers.gcp_tpu import config, tpu_quota
from infra.providers.gcp_tpu.spec import Spec

T = TypeVar("T")


@dataclass
class Report:
    """What pre-flight found; every check passed if a Report exists."""

    #: One line per check that passed, for `invoke plan`.
    passed: list[str] = field(default_factory=list)
    #: Problems that do not stop `up` (e.g. quota for full scale-out).
    warnings: list[str] = field(default_factory=list)
    #: vCPUs per machine type as the API reports them.
    guest_cpus: dict[str, int] = field(default_factory=dict)
    #: The zones that offer everything, in the spec's order; the first is the chosen one.
    zones: list[str] = field(default_factory=list)
    #: Why a listed zone was passed over ("zone: reason").
    skipped: list[str] = field(default_factory=list)


def run(spec: Spec, api: Gcp, ours: bool) -> Report:
    """All checks; `ours` says whether state already lists this cluster's Ray nodes."""
    report = Report()
    _project(spec, api, report)
    if spec.zones is None:
        _zone_checks(spec, api, report)
        report.zones = [spec.zone]
    else:
        _choose_zone(spec, api, report)
        spec = spec.model_copy(update={"zone": report.zones[0]})
    _quotas(spec, api, report)
    if spec.tpu_workers:
        tpu_quota.check(spec, api, spec.region_name, report.passed, report.warnings)
    if spec.queued_slices:
        _queued_slices(spec, api, report)
    for zone in report.zones:
        _name_is_free(spec.model_copy(update={"zone": zone}), api, ours, report)
    return report


def _zone_checks(spec: Spec, api: Gcp, report: Report) -> None:
    _zone_and_network(spec, api, report)
    _machine_types(spec, api, report)
    if spec.tpu_workers:
        _tpus(spec, api, report)


def _choose_zone(spec: Spec, api: Gcp, report: Report) -> None:
    """Run the zone checks for each of `zones:`; the first that passes is the cluster's zone."""
    for zone in spec.candidate_zones:
        trial = Report()
        try:
            _zone_checks(spec.model_copy(update={"zone": zone}), api, trial)
        except GcpNotFoundError as exc:
            report.skipped.append(f"{zone}: {_reason(exc)}")
            continue
        except GcpError as exc:
            if type(exc) is not GcpError:  # credentials, permissions, disabled APIs: not the zone's
                raise
            report.skipped.append(f"{zone}: {_reason(exc)}")
            continue
        if not report.zones:
            report.passed += trial.passed
            report.warnings += trial.warnings
            report.guest_cpus = trial.guest_cpus
        report.zones.append(zone)
    if not report.zones:
        raise GcpNotFoundError(
            f"gcp-tpu: no zone in zones: offers everything {spec.source} asks for ("
            + "; ".join(report.skipped) + "); list other zones or pick other types", status=404)
    fallback = f"; falls back to {', '.join(report.zones[1:])}" if report.zones[1:] else ""
    skipped = f"; skipped {'; '.join(report.skipped)}" if report.skipped else ""
    report.passed.append(f"zone {report.zones[0]} chosen from zones: {', '.join(spec.candidate_zones)}"
                         f"{fallback}{skipped}")


def _reason(exc: GcpError) -> str:
    """The part of a check's message that says what is missing (without the fix for one zone)."""
    text = str(exc).removeprefix("gcp-tpu: ")
    return text.split("; ", 1)[0]


def _project(spec: Spec, api: Gcp, report: Report) -> None:
    try:
        api.get_project()
    except (GcpNotFoundError, GcpPermissionError) as exc:
        raise type(exc)(
            f"gcp-tpu: project {spec.project!r} not found or not visible to these credentials; "
            f"check project: in {spec.source} (`gcloud projects list` shows yours)",
            status=exc.status, reason=exc.reason) from None
    report.passed.append(f"project {spec.project} reachable, Compute Engine API enabled")


def _found(call: Callable[[], T], missing: str) -> T:
    """What `call` reads from Google, or (a 404) one line saying what is missing and the fix."""
    try:
        return call()
    except GcpNotFoundError:
        raise GcpNotFoundError(f"gcp-tpu: {missing}", status=404) from None


def _zone_and_network(spec: Spec, api: Gcp, report: Report) -> None:
    zone = _found(lambda: api.get_zone(spec.zone),
                  f"zone {spec.zone!r} does not exist; set zone: in {spec.source} to one of "
                  "`gcloud compute zones list`")
    if zone.get("status", "UP") != "UP":
        raise GcpError(f"gcp-tpu: zone {spec.zone} is {zone.get('status')}; pick another zone: "
                       f"in {spec.source}")
    _found(lambda: api.get_network(spec.network),
           f"network {spec.network!r} not found in project {spec.project}; set network: in "
           f"{spec.source} (`gcloud compute networks list`)")
    report.passed.append(f"zone {spec.zone} is UP, network {spec.network} exists")


def _machine_types(spec: Spec, api: Gcp, report: Report) -> None:
    wanted = {"head.machine_type": spec.head.machine_type}
    wanted |= {f"cpu_workers.{n}.machine_type": t.machine_type for n, t in spec.cpu_workers.items()}
    for where, machine_type in wanted.items():
        if machine_type in report.guest_cpus:
            continue
        found = _found(partial(api.get_machine_type, spec.zone, machine_type),
                       f"{where}: {machine_type!r} is not offered in {spec.zone}; pick one from "
                       f"`gcloud compute machine-types list --zones {spec.zone}`")
        report.guest_cpus[machine_type] = int(found.get("guestCpus", 0))
    for name, t in spec.cpu_workers.items():
        actual = report.guest_cpus.get(t.machine_type)
        if actual and actual != t.vcpus:
            report.warnings.append(f"cpu_workers.{name}: Ray is told {t.vcpus} CPUs but "
                                   f"{t.machine_type} has {actual} vCPUs")
    report.passed.append(f"machine types offered in {spec.zone}: {', '.join(sorted(report.guest_cpus))}")


def _tpus(spec: Spec, api: Gcp, report: Report) -> None:
    offered = _found(lambda: api.accelerator_types(spec.zone),
                     f"zone {spec.zone} offers no TPUs; set zone: in {spec.source} to a TPU zone "
                     "(`gcloud compute tpus locations list`)")
    types = {str(a.get("type")) for a in offered}
    configs = {(str(c.get("type")), str(c.get("topology")))
               for a in offered for c in a.get("acceleratorConfigs", [])}
    for name, t in spec.tpu_workers.items():
        shape = t.slice
        if shape.topology is not None:
            ok = (shape.generation.config_type, shape.topology) in configs
            what = f"{shape.generation.config_type} {shape.topology}"
        else:
            ok = shape.accelerator_type in types
            what = shape.accelerator_type
        if not ok:
            listed = ", ".join(sorted(types)[:12]) or "none"
            raise GcpNotFoundError(
                f"gcp-tpu: tpu_workers.{name}: {what} is not offered in {spec.zone} (offered: "
                f"{listed}); pick another type or zone", status=404)
    versions = {str(v.get("version")) for v in api.runtime_versions(spec.zone)}
    for name, t in spec.tpu_workers.items():
        if t.runtime not in versions:
            listed = ", ".join(sorted(versions)[:12]) or "none"
            raise GcpNotFoundError(
                f"gcp-tpu: tpu_workers.{name}: runtime version {t.runtime!r} is not available in "
                f"{spec.zone} (available: {listed}); set runtime_version:", status=404)
    report.passed.append(
        "Cloud TPU API enabled; offered in " + spec.zone + ": "
        + ", ".join(f"{t.slice.accelerator_type} ({t.runtime})" for t in spec.tpu_workers.values()))


def _queued_slices(spec: Spec, api: Gcp, report: Report) -> None:
    """Each queued slice's type and runtime in each of its zones: a zone without them is a
    warning (a request there would fail), no zone at all is an error."""
    offers: dict[str, tuple[set[str], set[tuple[str, str]], set[str]]] = {}
    for name, s in spec.queued_slices.items():
        shape, usable = s.slice, []
        for zone in spec.slice_zones(name):
            if zone not in offers:
                try:
                    offered = api.accelerator_types(zone)
                    versions = {str(v.get("version")) for v in api.runtime_versions(zone)}
                except GcpNotFoundError:
                    offered, versions = [], set()
                offers[zone] = ({str(a.get("type")) for a in offered},
                                {(str(c.get("type")), str(c.get("topology")))
                                 for a in offered for c in a.get("acceleratorConfigs", [])},
                                versions)
            types, configs, versions = offers[zone]
            ok = ((shape.generation.config_type, shape.topology) in configs
                  if shape.topology is not None else shape.accelerator_type in types)
            if ok and s.runtime in versions:
                usable.append(zone)
            else:
                report.warnings.append(f"queued_slices.{name}: {shape.accelerator_type} with "
                                       f"{s.runtime} is not offered in {zone}; a request there "
                                       "would fail")
        if not usable:
            raise GcpNotFoundError(
                f"gcp-tpu: queued_slices.{name}: {shape.accelerator_type} with runtime "
                f"{s.runtime} is offered in none of its zones ({', '.join(spec.slice_zones(name))});"
                " pick another type, runtime_version or zones", status=404)
        report.passed.append(f"queued_slices.{name}: {shape.accelerator_type} ({s.runtime}, "
                             f"{s.provisioning}) offered in {', '.join(usable)}")


def _quota(quotas: list[dict[str, Any]], metric: str) -> tuple[float, float] | None:
    for q in quotas:
        if q.get("metric") == metric:
            return float(q.get("limit", 0)), float(q.get("usage", 0))
    return None


def _quotas(spec: Spec, api: Gcp, report: Report) -> None:
    """Regional Compute quotas for what `up` starts at once; full scale-out only warns."""
    quotas = api.get_region(spec.region_name).get("quotas", [])
    head_cpus = report.guest_cpus.get(spec.head.machine_type, 0)
    now: dict[str, float] = {}
    full: dict[str, float] = {}

    def need(metric: str, amount: float, at_once: float) -> None:
        now[metric] = now.get(metric, 0) + at_once
        full[metric] = full.get(metric, 0) + amount

    def cpu_metrics(machine_type: str, provisioning: str) -> list[str]:
        family = machine_type.split("-")[0].upper()
        metrics = [f"{family}_CPUS"] if _quota(quotas, f"{family}_CPUS") else []
        preemptible = _quota(quotas, "PREEMPTIBLE_CPUS")
        # Spot VMs use PREEMPTIBLE_CPUS when the project has that quota, else the normal one.
        if provisioning != "standard" and preemptible and preemptible[0] > 0:
            return [*metrics, "PREEMPTIBLE_CPUS"]
        return [*metrics, "CPUS"]

    for metric in cpu_metrics(spec.head.machine_type, "standard"):
        need(metric, head_cpus, head_cpus)
    need("IN_USE_ADDRESSES", 1, 1)
    for t in spec.cpu_workers.values():
        cpus = report.guest_cpus.get(t.machine_type, t.vcpus)
        for metric in cpu_metrics(t.machine_type, t.provisioning):
            need(metric, cpus * t.max_workers, cpus * t.min_workers)
        need("IN_USE_ADDRESSES", t.max_workers, t.min_workers)
    for metric in sorted(now):
        found = _quota(quotas, metric)
        if found is None:
            continue
        limit, usage = found
        free = limit - usage
        if now[metric] > free:
            raise GcpQuotaError(
                f"gcp-tpu: quota {metric} in {spec.region_name}: {free:g} free of {limit:g}, but the "
                f"head and min_workers need {now[metric]:g}; lower min_workers or request more at "
                f"https://console.cloud.google.com/iam-admin/quotas?project={spec.project}",
                reason="QUOTA_EXCEEDED")
        if full[metric] > free:
            report.warnings.append(
                f"quota {metric} in {spec.region_name} ({free:g} free) covers less than full "
                f"scale-out ({full[metric]:g}); the autoscaler will stop short")
    if spec.dashboard.allowed_source_ranges:
        firewalls = _quota(api.get_project().get("quotas", []), "FIREWALLS")
        if firewalls and firewalls[1] >= firewalls[0] and api.get_firewall(
                config.firewall_name(spec.name)) is None:
            raise GcpQuotaError(
                f"gcp-tpu: quota FIREWALLS is used up ({firewalls[1]:g} of {firewalls[0]:g}); "
                "delete an unused rule or remove dashboard.allowed_source_ranges (SSH tunnel only)",
                reason="QUOTA_EXCEEDED")
    report.passed.append(f"Compute quotas in {spec.region_name} cover the head and min_workers")


def _name_is_free(spec: Spec, api: Gcp, ours: bool, report: Report) -> None:
    """Ray finds a cluster's nodes by name label alone: refuse to adopt someone else's."""
    if ours:
        return
    label = {config.RAY_CLUSTER_LABEL: spec.name}
    found = [i["name"] for i in api.instances(spec.zone, label)]
    if spec.tpu_workers:
        found += [n["name"].rsplit("/", 1)[-1] for n in api.tpu_nodes(spec.zone, label)]
    if found:
        raise GcpError(
            f"gcp-tpu: project {spec.project} already has nodes of a Ray cluster named "
            f"{spec.name!r} in {spec.zone} ({', '.join(sorted(found)[:3])}) that this machine's "
            f"state does not list; rename the spec file (the cluster name is its name) or delete "
            "those nodes")
    report.passed.append(f"no other Ray cluster named {spec.name!r} in {spec.zone}")

"""`status`: what the provider lists of a cluster and, while it runs, what Ray reports (nodes,
resources, jobs), the tracking server and Serve, the sharing gateway and its members, the cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra import providers
from infra.app import clusters
from infra.app.progress import Progress
from infra.core import auth, jobs, spec, state
from infra.core.sharing import owner as sharing
from infra.core.state import State
from infra.providers.base import Endpoint, Provider, ProviderStatus


@dataclass(frozen=True)
class StatusResult:
    spec: spec.ClusterSpec
    #: The cluster's state (a new, unsaved one when it has none).
    state: State
    provider: ProviderStatus
    #: What Ray reports while it runs: "nodes" (rows), "resources" (totals), "jobs" (rows).
    ray: dict[str, Any] = field(default_factory=dict)
    #: Why Ray did not answer although the provider reports the cluster running ("" if it did).
    ray_error: str = ""
    #: The tracking server and Serve applications (core/serve.py's `status_extras`).
    extras: dict[str, Any] = field(default_factory=dict)
    #: The sharing budget's figures (None without sharing or usage).
    budget: dict[str, Any] | None = None
    #: The gateway's address and the members, one row per person (None without sharing).
    sharing: dict[str, Any] | None = None
    #: Where a remote head's tracking data is safe (None for clusters without such a store).
    copy_note: str | None = None
    job_reach: str = ""


def status(selected: spec.ClusterSpec, progress: Progress,
           impl: Provider[Any, Any] | None = None) -> StatusResult:
    """The cluster of `selected` as its provider and, while it runs, Ray see it; never raises for
    a Ray that does not answer (`ray_error` says so). Its answer is all it has to say: `progress`
    is taken as every use case's, and not called."""
    impl = impl or providers.create(selected)
    current = state.read(selected.name) or State.new(state.state_path(selected.name),
                                                     selected.name, selected.provider)
    provider_view = impl.status(current)
    ray_view, ray_error, extras = _ask_ray(selected, impl, current) if provider_view.running \
        else ({}, "", {})
    from infra.core.tracking import remote as tracking_remote

    # The head's usage while it runs, else the copy kept here.
    budget = sharing.budget_status(
        selected, clusters.head_or_none(impl, current) if provider_view.running else None)
    return StatusResult(
        spec=selected, state=current, provider=provider_view, ray=ray_view, ray_error=ray_error,
        extras=extras, budget=budget, sharing=sharing_view(selected, provider_view.running),
        copy_note=tracking_remote.copy_note(current), job_reach=impl.job_reach)


def _ask_ray(selected: spec.ClusterSpec, impl: Provider[Any, Any],
             current: State) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """What Ray reports, why it did not answer, and the tracking server's and Serve's view."""
    from infra.core import serve

    ray_view: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    try:
        with impl.connect(current) as endpoint:
            ray_view = ray_status(endpoint)
            extras = serve.status_extras(endpoint)
        if selected.sharing is not None:
            sharing.name_members(selected, impl, current, ray_view["jobs"])
    except Exception as exc:  # any failure to reach Ray is reported, never a traceback
        reason = str(exc).splitlines()[0].split(". ")[0] if str(exc) else type(exc).__name__
        flag = clusters.cluster_flag(selected)
        return ray_view, (f"the provider reports {selected.name!r} running, but Ray is not "
                          f"answering ({auth.scrub(reason, auth.token_file(current))[:200]}); "
                          f"`invoke up{flag}` restarts it, `invoke teardown{flag}` removes it"), extras
    return ray_view, "", extras


def ray_status(endpoint: Endpoint) -> dict[str, Any]:
    """What Ray itself reports: nodes, total resources of alive nodes, jobs."""
    nodes = jobs.list_nodes(endpoint)
    resources: dict[str, float] = {}
    rows = []
    for node in nodes:
        alive = node.state == "ALIVE"
        if alive:
            for key, value in (node.resources_total or {}).items():
                if not key.startswith("node:"):
                    resources[key] = resources.get(key, 0.0) + float(value)
        rows.append({"node": node.node_id[:12], "ip": node.node_ip, "state": node.state,
                     "head": "yes" if node.is_head_node else "",
                     "CPU": f"{(node.resources_total or {}).get('CPU', 0):g}"})
    return {"nodes": rows, "resources": resources, "jobs": jobs.list_jobs(endpoint)}


def sharing_view(selected: Any, running: bool) -> dict[str, Any] | None:
    """The owner's `status` of a shared cluster: the gateway's address and the members' state,
    one row per person, from the registry and the usage copy `status` has just fetched."""
    from infra.core.sharing import term as sharing_term
    from infra.core.sharing import term_people

    if selected.sharing is None:
        return None
    current = state.read(selected.name)
    usage = sharing.read_usage(selected, None)
    rows = sharing_term.rows_of(sharing_term.read_book(selected.name), usage,
                                sharing.job_records(usage), selected.sharing)
    url = current.info.gateway_url if running and current is not None else None
    return {"gateway_url": url, "members": term_people.people(rows, selected.sharing)}

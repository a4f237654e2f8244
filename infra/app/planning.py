"""`plan`: what `up` would create, rendered and checked, creating nothing; and the rendered files
`up` keeps as applied (the next plan's diff)."""

from __future__ import annotations

import difflib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import providers
from infra.app import clusters
from infra.app.progress import Progress, warn
from infra.core import drift, paths, spec, state
from infra.core.costs import CostRange
from infra.core.sharing import owner as sharing
from infra.node.files import atomic_write
from infra.providers.base import Plan, Provider


@dataclass(frozen=True)
class PlanResult:
    spec: spec.ClusterSpec
    plan: Plan[Any]
    #: Unified diff of the rendered files against the last `up`'s ("" before the first one).
    diff: str
    #: The spec's fields changed since the last `up` of the running cluster.
    spec_changes: list[drift.Change]
    cost_range: CostRange | None
    #: What the sharing gateway will be (None without sharing).
    gateway_note: str | None
    #: Dollar budgets of `sharing:` the gateway cannot reach (the nodes have no price).
    unpriced_budgets: list[str]
    #: Where jobs run, when the provider says so ("" otherwise).
    job_reach: str
    #: Where the rendered files were written.
    rendered: Path
    #: Whether an `up` kept its rendered files (the diff's other side).
    applied: bool


def write_rendered(name: str, plan: Plan[Any]) -> None:
    folder = paths.rendered_dir(name)
    shutil.rmtree(folder, ignore_errors=True)
    for file_name, text in plan.files.items():
        atomic_write(folder / file_name, text)


def keep_applied(name: str) -> None:
    """What `up` just applied (the rendered files, and any a provider wrote there during `up`),
    for the next `plan`'s diff; each file through the one atomic write."""
    applied = paths.applied_dir(name)
    shutil.rmtree(applied, ignore_errors=True)
    for file in sorted(p for p in paths.rendered_dir(name).glob("*") if p.is_file()):
        atomic_write(applied / file.name, file.read_bytes())


def diff(name: str, plan: Plan[Any]) -> str:
    """Unified diff of the rendered files against those of the last successful `up`; empty
    before the first one (everything would be new: the plan's table says so already)."""
    applied = paths.applied_dir(name)
    if not applied.exists():
        return ""
    chunks: list[str] = []
    for file_name in sorted(set(plan.files) | {p.name for p in applied.glob("*")}):
        old_path = applied / file_name
        old = old_path.read_text().splitlines(keepends=True) if old_path.exists() else []
        new = plan.files.get(file_name, "").splitlines(keepends=True)
        chunks += difflib.unified_diff(old, new, f"applied/{file_name}", f"rendered/{file_name}")
    return "".join(chunks)


def unpriced_budgets(selected: spec.ClusterSpec, cost: CostRange | None) -> list[str]:
    """The dollar budgets of `sharing:` that the gateway cannot reach: it counts $0 for a cluster
    whose nodes have no price (`CostRange.node_prices` None)."""
    shared = selected.sharing
    if shared is None or (cost is not None and cost.node_prices is not None):
        return []
    return [k for k in ("member_budget_usd", "budget_usd") if getattr(shared, k)]


def plan(selected: spec.ClusterSpec, progress: Progress,
         impl: Provider[Any, Any] | None = None) -> PlanResult:
    """Render and check what `up` would create for `selected`, write the files to
    `.rayfleet/rendered/<cluster>/` and compare them and the spec with the last `up`'s."""
    impl = impl or providers.create(selected)
    clusters.refuse_what_the_provider_lacks(selected)
    # What `up` will say of members' jobs, said first here.
    warn(progress, sharing.privilege_warning(selected))
    current = state.read(selected.name)
    result = impl.plan(current)
    write_rendered(selected.name, result)
    running = current is not None and not current.empty
    cost_range = impl.cost_range(result)
    return PlanResult(
        spec=selected, plan=result, diff=diff(selected.name, result),
        spec_changes=drift.changes(drift.read_applied(selected.name), selected) if running else [],
        cost_range=cost_range, gateway_note=sharing.plan_note(selected, current),
        unpriced_budgets=unpriced_budgets(selected, cost_range), job_reach=impl.job_reach,
        rendered=paths.rendered_dir(selected.name),
        applied=paths.applied_dir(selected.name).exists())

"""What each `invoke` task does, as plain functions: resolve the spec, lock, call the provider, print.

Shared code never branches on the provider's name: whatever differs is a provider verb.
"""

from __future__ import annotations

import difflib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infra.cli import common, loading
from infra.core import auth, costs, drift, jobs, paths, raynoise, spec, ssh, state, tunnels, ui
from infra.core.autodown import view as autodown_view
from infra.core.errors import RayfleetError, SpecError
from infra.core.sharing import membership
from infra.core.sharing import owner as sharing
from infra.core.state import State
from infra.node.files import atomic_write
from infra.providers import features
from infra.providers.base import Endpoint, Plan, Provider, UpOptions


def _write_rendered(name: str, plan: Plan[Any]) -> None:
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


def _diff(name: str, plan: Plan[Any]) -> str:
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


def plan(provider: str | None, cluster: str | None, as_json: bool) -> None:
    membership.refuse_owner_verb(cluster, "plan")
    selected, impl = common.select(provider, cluster)
    refuse_what_the_provider_lacks(selected)
    sharing.warn_privilege(selected)  # what `up` will say of members' jobs, said first here
    current = state.read(selected.name)
    result = impl.plan(current)
    _write_rendered(selected.name, result)
    diff = _diff(selected.name, result)
    running = current is not None and not current.empty
    spec_changes = drift.changes(drift.read_applied(selected.name), selected) if running else []
    cost_range = impl.cost_range(result)
    gateway = sharing.plan_note(selected, current)
    unpriced = _unpriced_budgets(selected, impl, result)
    if as_json:
        ui.out(json.dumps({
            "cluster": selected.name,
            "provider": selected.provider,
            "resources": [r.__dict__ for r in result.resources],
            "files": sorted(result.files),
            "notes": list(result.notes),
            # (node_prices: the gateway's, not a figure of the plan)
            "cost_range": {k: v for k, v in cost_range.__dict__.items() if k != "node_prices"}
            if cost_range else None,
            "autodown": selected.autodown.idle_minutes if selected.autodown else None,
            "diff": diff,
            "spec_changes": [dict(c.__dict__) for c in spec_changes],
            "problems": result.problems, "job_reach": impl.job_reach or None,
            "gateway": {"port": selected.sharing.port, "note": gateway,
                        "unpriced_budgets": unpriced} if selected.sharing else None,
        }, indent=2), soft_wrap=True, markup=False)
        _refuse_problems(result)
        return
    from rich.table import Table

    table = Table(title=f"invoke up would create for {selected.name} ({selected.provider})")
    for column in ("", "kind", "name", "detail"):
        table.add_column(column)
    for r in result.resources:
        table.add_row("=" if r.exists else "+", r.kind, r.name, r.detail)
    ui.out(table)
    for note in result.notes:
        ui.out(f"• {note}", markup=False)
    if gateway:
        ui.out(f"• {gateway}", markup=False)
    if unpriced:
        ui.warn(f"{selected.source}: {' and '.join(f'sharing.{k}' for k in unpriced)}: this "
                "cluster's nodes have no price here (a local or Slurm cluster costs no money), so "
                "its cost share stays $0 and a dollar budget is never reached; "
                "sharing.member_budget_hours limits job-hours")
    if cost_range is not None:
        ui.out(f"• {costs.describe_range(cost_range)}", markup=False)
    ui.out(f"• {costs.describe_autodown(selected)}", markup=False)
    if impl.job_reach:
        ui.out(f"• {impl.job_reach}", markup=False)
    if spec_changes:
        ui.out("the spec changed since the last `invoke up` of this running cluster:")
        for change in spec_changes:
            ui.out(f"  {change.describe()}", markup=False)
    folder = paths.rendered_dir(selected.name)
    ui.out(f"rendered: {', '.join(str(folder / f) for f in sorted(result.files)) or 'nothing'}")
    if diff:
        ui.out("changes since the last `invoke up`:")
        ui.out(diff, markup=False, highlight=False)
    elif paths.applied_dir(selected.name).exists() and any(not c.applied for c in spec_changes):
        # `up` keeps what it rendered even when the running cluster could not take all of it.
        ui.out("the rendered files are those of the last `invoke up`, but the running cluster "
               "does not have the changes above that need a new cluster")
    elif paths.applied_dir(selected.name).exists() and spec_changes:
        # The spec's fields above are settings `up` applies in place, not a rendered file.
        ui.out("the rendered files are those of the last `invoke up`; `invoke up` applies the "
               "spec changes above to the running cluster")
    elif paths.applied_dir(selected.name).exists():
        ui.out("no changes since the last `invoke up`")
    else:
        ui.out("nothing applied yet")
    from rich.markup import escape

    for problem in result.problems:
        ui.info(f"[red]✗[/red] {escape(problem)}")
    _refuse_problems(result)


def _unpriced_budgets(selected: spec.ClusterSpec, impl: Provider[Any, Any],
                      result: Plan[Any]) -> list[str]:
    """The dollar budgets of `sharing:` that the gateway cannot reach: it counts $0 for a cluster
    whose nodes have no price (`CostRange.node_prices` None)."""
    shared = selected.sharing
    cost = impl.cost_range(result)
    if shared is None or (cost is not None and cost.node_prices is not None):
        return []
    return [k for k in ("member_budget_usd", "budget_usd") if getattr(shared, k)]


class PlanProblemsError(RayfleetError):
    """A pre-flight check of `plan` failed: `up` would fail the same way."""


def _refuse_problems(result: Plan) -> None:
    count = len(result.problems)
    if count:
        raise PlanProblemsError(f"{count} pre-flight check{'s' if count > 1 else ''} failed (above); "
                                "fix them before `invoke up`")


def refuse_what_the_provider_lacks(selected: spec.ClusterSpec) -> None:
    """The one check of a spec against its provider's table (infra/core/capabilities.py), before
    `plan` or `up` does anything: a key the provider cannot honour is a SpecError in one line
    naming it (sharing's own part, its gateway and its users, is `sharing.check_spec`). Metrics
    alone are not refused: `up` warns and the cluster runs without them."""
    sharing.check_spec(selected)
    if selected.tracking != "none" and not type(selected).CAPABILITIES.tracking:
        raise SpecError(f"{selected.source}: tracking: {selected.tracking} is not available on the "
                        f"{selected.provider} provider yet; remove the key (see "
                        "docs/train-track-serve.md)")


def up(provider: str | None, cluster: str | None, keep_partial: bool) -> None:
    membership.refuse_owner_verb(cluster, "up")
    selected, impl = common.select(provider, cluster)
    refuse_what_the_provider_lacks(selected)
    sharing.warn_privilege(selected)
    if selected.metrics != "none" and not type(selected).CAPABILITIES.metrics:
        ui.warn(f"{selected.source}: metrics: {selected.metrics} is not available on the "
                f"{selected.provider} provider yet; the cluster runs without metrics")
    with state.locked(selected.name, selected.provider, "up") as current:
        _autodown_notices(selected, impl, current)
        running_before = not current.empty
        applied_spec = drift.read_applied(selected.name)
        pending = [c for c in drift.changes(applied_spec, selected) if not c.applied] \
            if running_before else []
        in_place = drift.applied_line(drift.changes(applied_spec, selected)) \
            if running_before else None
        result = impl.plan(current)
        # After the plan's checks: a spec the target cannot run leaves no state behind.
        if auth.ensure_token(current, enabled=selected.auth == "token") is None:
            ui.warn(f"{selected.source}: auth: none — Ray's job API and dashboard on this cluster "
                    "accept anyone who can reach them; remove `auth: none` to turn token auth on")
        # `invoke list` finds every cluster by its state file, and its spec by this path.
        spec_file = str(Path(selected.source).resolve())
        if current.info.spec_path != spec_file:
            current.set_info(spec_path=spec_file)
        cost_range = impl.cost_range(result)
        if cost_range is not None:
            ui.info(costs.describe_range(cost_range))
        _write_rendered(selected.name, result)
        try:
            endpoint = impl.up(current, result, UpOptions(keep_partial=keep_partial))
        except BaseException:
            _forget_if_nothing_created(current)
            raise
        gateway_url = sharing.ensure_gateway(selected, impl.head_access(current), current,
                                             cost_range.node_prices if cost_range else None) \
            if selected.sharing else None
        keep_applied(selected.name)
        drift.keep(selected, applied_spec, running_before)
    flag = common.cluster_flag(selected)
    for change in pending:
        ui.warn(f"{selected.source}: {change.field} changed to {json.dumps(change.after)}, but "
                f"the running cluster keeps {json.dumps(change.before)}: it needs a new cluster "
                f"(`invoke teardown{flag}`, then `invoke up{flag}`)")
    ui.out(f"cluster {selected.name!r} ({selected.provider}) is up")
    if in_place:
        ui.out(in_place, markup=False)
    ui.out(f"  Ray address:  {endpoint.address}", markup=False)
    ui.out(f'  Ray\'s tools:  eval "$(invoke env{flag})"   (ray status, ray job submit, '
           "ray.init())", markup=False)
    ui.out(f"  dashboard:    {endpoint.dashboard_url}   (`invoke dashboard{flag}`)", markup=False)
    ui.out(f"  submit a job: invoke submit{flag} examples/cpu_example.py -- 8", markup=False)
    ui.out(f"  tear down:    invoke teardown{flag}", markup=False)
    if gateway_url:
        ui.out(f"  members:      {gateway_url}   (`invoke member-add{flag} NAME`)", markup=False)
    ui.out(f"  {costs.describe_autodown(selected)}", markup=False)


def _autodown_notices(selected: spec.ClusterSpec, impl: Provider[Any, Any], current: State) -> None:
    """Say that the cluster removed itself (if it did), and warn when nothing will remove it."""
    if current.path.exists():
        _say_if_removed(selected, impl, current)
    if selected.autodown_turned_off and type(selected).CAPABILITIES.autodown_default_minutes:
        ui.warn(f"{selected.source}: autodown: null — this cluster never removes itself; it costs "
                f"money until `invoke teardown{common.cluster_flag(selected)}`")


def _say_if_removed(selected: spec.ClusterSpec, impl: Provider[Any, Any], current: State) -> bool:
    try:
        report = features.autodown_report(impl, current)
    except RayfleetError:
        return False
    if report is None or not report.removed_at:
        return False
    ui.info(f"cluster {selected.name!r} {autodown_view.describe(report)}")
    return True


def _forget_if_nothing_created(current: State) -> None:
    """A refused first `up` leaves no trace: no state file, no token (nothing to tear down)."""
    if current.empty and not current.info.dashboard_url:
        current.delete()
        auth.token_path(current.cluster).unlink(missing_ok=True)


@contextmanager
def connect(provider: str | None, cluster: str | None) -> Iterator[Endpoint]:
    """The running cluster's endpoint for the length of a `with` block (a tunnel if remote);
    also used beyond the tasks, e.g. by the Hydra launcher in examples/hydra_plugins/. A cluster
    joined as a member (`invoke join`) is reached through its gateway."""
    if membership.joined(cluster):
        yield membership.endpoint(str(cluster))
        return
    selected, impl = common.select(provider, cluster)
    with impl.connect(common.running(selected)) as endpoint:
        yield endpoint


class RayNotAnsweringError(RayfleetError):
    """The provider reports the cluster running, but Ray's dashboard does not answer."""


def status(provider: str | None, cluster: str | None, as_json: bool) -> int:
    selected, impl = common.select(provider, cluster)
    current = state.read(selected.name) or State.new(state.state_path(selected.name),
                                                     selected.name, selected.provider)
    provider_view = impl.status(current)
    ray_view: dict[str, Any] = {}
    ray_error = ""
    extras: dict[str, Any] = {}
    if provider_view.running:
        from infra.core import serve

        try:
            with impl.connect(current) as endpoint:
                ray_view = _ray_status(endpoint)
                extras = serve.status_extras(endpoint)
            if selected.sharing is not None:
                sharing.name_members(selected, impl, current, ray_view["jobs"])
        except Exception as exc:  # any failure to reach Ray is reported, never a traceback
            reason = str(exc).splitlines()[0].split(". ")[0] if str(exc) else type(exc).__name__
            ray_error = (f"the provider reports {selected.name!r} running, but Ray is not answering "
                         f"({auth.scrub(reason, auth.token_file(current))[:200]}); "
                         f"`invoke up{common.cluster_flag(selected)}` restarts it, "
                         f"`invoke teardown{common.cluster_flag(selected)}` removes it")
    from infra.core.sharing import term as sharing_term
    from infra.core.tracking import remote as tracking_remote

    # The head's usage while it runs, else the copy kept here.
    budget = sharing.budget_status(
        selected, _head_or_none(impl, current) if provider_view.running else None)
    from infra.cli import term as commands_term

    shared = commands_term.status_sharing(selected, provider_view.running)  # gateway, members
    # Where a remote head's tracking data is safe: None for clusters without such a store.
    copy_note = tracking_remote.copy_note(current)
    if as_json:
        ui.out(json.dumps({
            "cluster": selected.name, "provider": selected.provider,
            "cluster_id": current.cluster_id if current.path.exists() else None,
            "running": provider_view.running, "summary": provider_view.summary,
            "provider_resources": provider_view.rows, "warnings": provider_view.warnings,
            "state": provider_view.state_label,
            "cost": provider_view.cost.__dict__ if provider_view.cost else None,
            "autodown": provider_view.autodown.__dict__ if provider_view.autodown else None,
            "ray_error": ray_error or None, **ray_view, **extras,
            "tracking_copy": copy_note, "tracking_copied_at": current.info.tracking_copied_at,
            "job_reach": impl.job_reach or None, "sharing_budget": budget, "sharing": shared,
        }, indent=2), soft_wrap=True, markup=False)
        return 1 if ray_error else 0
    ui.out(f"{_title(selected)}: {provider_view.summary}", markup=False)
    if provider_view.cost is not None:
        ui.out(f"cost: {costs.describe_cost(provider_view.cost)}", markup=False)
    if provider_view.autodown is not None:
        ui.out(autodown_view.describe(provider_view.autodown), markup=False)
    if shared is not None:
        commands_term.print_status_sharing(selected, shared)
    if budget is not None and selected.sharing is not None:
        sharing_term.print_budget_status(selected.sharing, budget)
    if impl.job_reach:
        ui.out(impl.job_reach, markup=False)
    common.table("provider resources", provider_view.rows)
    for warning in provider_view.warnings:
        ui.warn(warning)
    if ray_view:
        common.table("Ray nodes", ray_view["nodes"])
        totals = ", ".join(f"{k} {_amount(k, v)}" for k, v in sorted(ray_view["resources"].items()))
        ui.out(f"Ray resources (alive nodes): {totals}", markup=False)
        common.table("jobs", ray_view["jobs"])
    if extras:
        from infra.core import serve

        serve.print_status_extras(extras)
    if copy_note:
        ui.out(copy_note, markup=False, soft_wrap=True)
    if ray_error:
        raise RayNotAnsweringError(ray_error)
    return 0


def _title(selected: spec.ClusterSpec) -> str:
    """"name (provider)", or just the name when it is the provider's (its default spec)."""
    if selected.name == selected.provider:
        return selected.name
    return f"{selected.name} ({selected.provider})"


def _amount(key: str, value: float) -> str:
    # Ray counts memory resources in bytes.
    return f"{value / 2**30:.1f} GiB" if "memory" in key else f"{value:g}"


def _ray_status(endpoint: Endpoint) -> dict[str, Any]:
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


def dashboard(provider: str | None, cluster: str | None) -> None:
    with connect(provider, cluster) as endpoint:
        ui.out(endpoint.dashboard_url, markup=False)
        _auth_howto(endpoint)
        hold_tunnel(endpoint)


def hold_tunnel(endpoint: Endpoint) -> None:
    """Keep a remote cluster's tunnel open until Ctrl+C (nothing to hold for a local one)."""
    if not endpoint.tunneled:
        return
    ui.info("tunnel open; press Ctrl+C to close it")
    import time

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        ui.info("closed")


def _auth_howto(endpoint: Endpoint) -> None:
    """How to use the cluster's token from a browser and from Ray's own CLI (the path, never the token)."""
    if endpoint.token_path is None:
        ui.info("this cluster runs without token auth (auth: none in its spec)")
        return
    path = endpoint.token_path
    ui.info(f"token auth is on. In a browser, paste the token from {path} when the dashboard asks "
            f"(e.g. `xclip -sel c < {path}`); it sets a cookie for that tab's origin.")
    ui.info(f"Ray's own CLI: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={path} "
            f"ray job submit --address {endpoint.dashboard_url} -- python script.py")


@contextmanager
def quiet_connect(provider: str | None, cluster: str | None) -> Iterator[Endpoint]:
    """`connect`, with Ray's client-side log lines (`INFO dashboard_sdk.py -- Uploading package`,
    ...) sent to the cluster's ray-client.log: the one way every command that talks to Ray's APIs
    through Ray's client library (submit, serve-deploy, the Hydra launcher) keeps them quiet."""
    if membership.joined(cluster):
        log = paths.home() / "logs" / str(cluster) / "ray-client.log"
        with raynoise.to_log(log):
            yield membership.endpoint(str(cluster))
        return
    selected, impl = common.select(provider, cluster)
    log = paths.home() / "logs" / selected.name / "ray-client.log"
    with impl.connect(common.running(selected)) as endpoint, raynoise.to_log(log):
        yield endpoint


def submit(provider: str | None, cluster: str | None, script: str, args: list[str],
           runtime_env_file: str | None, wait: bool, working_dir: str | None = None) -> int:
    command, env = jobs.prepare(script, args, runtime_env_file, working_dir)
    if membership.joined(cluster):  # a member near their budget is told (stock Ray says nothing)
        from infra.core.sharing import member_usage

        if near := member_usage.near_note(str(cluster)):
            ui.warn(near)
    with quiet_connect(provider, cluster) as endpoint:
        return jobs.submit(endpoint, command, env, wait, _again(provider, cluster))


def _again(provider: str | None, cluster: str | None) -> str:
    """How a hint names a later command on a job of this cluster (jobs.submit's `again`): a
    member's cluster by its name, with the command a member has (`rayfleet`)."""
    if membership.joined(cluster):
        return f"rayfleet {{verb}} {{job}} --cluster {cluster}"
    flag = common.cluster_flag(loading.resolve(provider, cluster)).replace("{", "{{").replace("}", "}}")
    return f"invoke {{verb}} {{job}}{flag}"


def _job_or_last(endpoint: Endpoint, job_id: str | None) -> str:
    if job_id:
        return job_id
    found = jobs.last_job(endpoint)
    ui.info(f"job {found} (the last one submitted)")
    return found


def _status_command(provider: str | None, cluster: str | None) -> str:
    if membership.joined(cluster):  # a member's command is `rayfleet` (no tasks.py of ours)
        return f"rayfleet status --cluster {cluster}"
    return f"invoke status{common.cluster_flag(loading.resolve(provider, cluster))}"


def logs(provider: str | None, cluster: str | None, job_id: str | None, follow: bool) -> int:
    with quiet_connect(provider, cluster) as endpoint:
        return jobs.logs(endpoint, _job_or_last(endpoint, job_id), follow,
                         _status_command(provider, cluster))


def stop_job(provider: str | None, cluster: str | None, job_id: str | None) -> None:
    with quiet_connect(provider, cluster) as endpoint:
        job = _job_or_last(endpoint, job_id)
        ui.out(f"job {job} {jobs.stop(endpoint, job, _status_command(provider, cluster))}")


def doctor(provider: str | None, cluster: str | None, as_json: bool) -> int:
    from infra.core import doctor as checkup

    with quiet_connect(provider, cluster) as endpoint:
        return checkup.run(endpoint, as_json)


def teardown(provider: str | None, cluster: str | None) -> None:
    membership.refuse_owner_verb(cluster, "teardown")
    selected, impl = common.select(provider, cluster)
    if not state.lock_path_of(selected.name).exists() and not state.state_path(selected.name).exists():
        # Never created here (no `up` ever took its lock): nothing to ask a provider about, no
        # credentials needed, and no lock file left behind.
        ui.out(f"cluster {selected.name!r}: nothing to tear down")
        return
    with state.locked(selected.name, selected.provider, "teardown") as current:
        had_state = current.path.exists()
        kept_store = current.info.tracking_store
        if had_state and _say_if_removed(selected, impl, current):
            ui.info("verifying that nothing of it is left, then clearing its state")
        if had_state:  # without state nothing was recorded, so nothing was created
            from infra.cli import metrics_history

            # Before any machine goes: the history lives on the head.
            metrics_history.keep_before_teardown(impl, current)
            if selected.sharing is not None:
                sharing.stop_gateway(selected, _head_or_none(impl, current))
            impl.teardown(current)
        current.delete()
    shutil.rmtree(paths.applied_dir(selected.name), ignore_errors=True)
    autodown_view.marker_path(selected.name).unlink(missing_ok=True)
    # The next cluster of this name gets a fresh token and fresh machines with new host keys.
    tunnels.close(selected.name)
    for leftover in (auth.token_path(selected.name), ssh.cluster_known_hosts(selected.name)):
        leftover.unlink(missing_ok=True)
    if had_state:
        ui.out(f"cluster {selected.name!r} is gone: nothing of it is left")
        if kept_store:
            ui.out(f"tracking data kept in {kept_store} (runs, metrics, models, artifacts); the "
                   "next `invoke up` of this cluster serves it again", markup=False, soft_wrap=True)
    else:
        ui.out(f"cluster {selected.name!r}: nothing to tear down")


def _head_or_none(impl: Provider[Any, Any], current: State) -> Any:
    """How to reach the head, or None once it is gone (teardown goes on without it)."""
    try:
        return impl.head_access(current)
    except RayfleetError:
        return None

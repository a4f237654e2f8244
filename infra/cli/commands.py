"""What each `invoke` task does, as plain functions: resolve the spec, call the library
(infra/app/: plan, up, status, teardown, connect) and print what it returns.

Shared code never branches on the provider's name: whatever differs is a provider verb.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from infra.app import clusters
from infra.app.clusters import refuse_what_the_provider_lacks as refuse_what_the_provider_lacks
from infra.app.planning import PlanResult
from infra.app.planning import keep_applied as keep_applied
from infra.cli import common, loading
from infra.core import costs, jobs, paths, raynoise, spec, ui
from infra.core.autodown import view as autodown_view
from infra.core.errors import RayfleetError
from infra.core.sharing import membership
from infra.providers.base import Endpoint, Plan

if TYPE_CHECKING:
    from infra.app.reporting import StatusResult


def plan(provider: str | None, cluster: str | None, as_json: bool) -> None:
    from infra.app import planning

    membership.refuse_owner_verb(cluster, "plan")
    found = planning.plan(loading.resolve(provider, cluster), common.Shown())
    if as_json:
        ui.out(json.dumps(_plan_as_dict(found), indent=2), soft_wrap=True, markup=False)
    else:
        _print_plan(found)
    _refuse_problems(found.plan)


def _plan_as_dict(found: PlanResult) -> dict[str, Any]:
    selected, result, cost_range = found.spec, found.plan, found.cost_range
    return {
        "cluster": selected.name,
        "provider": selected.provider,
        "resources": [r.__dict__ for r in result.resources],
        "files": sorted(result.files),
        "notes": list(result.notes),
        # (node_prices: the gateway's, not a figure of the plan)
        "cost_range": {k: v for k, v in cost_range.__dict__.items() if k != "node_prices"}
        if cost_range else None,
        "autodown": selected.autodown.idle_minutes if selected.autodown else None,
        "diff": found.diff,
        "spec_changes": [dict(c.__dict__) for c in found.spec_changes],
        "problems": result.problems, "job_reach": found.job_reach or None,
        "gateway": {"port": selected.sharing.port, "note": found.gateway_note,
                    "unpriced_budgets": found.unpriced_budgets} if selected.sharing else None,
    }


def _print_plan(found: PlanResult) -> None:
    from rich.table import Table

    selected, result = found.spec, found.plan
    table = Table(title=f"invoke up would create for {selected.name} ({selected.provider})")
    for column in ("", "kind", "name", "detail"):
        table.add_column(column)
    for r in result.resources:
        table.add_row("=" if r.exists else "+", r.kind, r.name, r.detail)
    ui.out(table)
    for note in result.notes:
        ui.out(f"• {note}", markup=False)
    if found.gateway_note:
        ui.out(f"• {found.gateway_note}", markup=False)
    if found.unpriced_budgets:
        ui.warn(f"{selected.source}: {' and '.join(f'sharing.{k}' for k in found.unpriced_budgets)}"
                ": this cluster's nodes have no price here (a local or Slurm cluster costs no "
                "money), so its cost share stays $0 and a dollar budget is never reached; "
                "sharing.member_budget_hours limits job-hours")
    if found.cost_range is not None:
        ui.out(f"• {costs.describe_range(found.cost_range)}", markup=False)
    ui.out(f"• {costs.describe_autodown(selected)}", markup=False)
    if found.job_reach:
        ui.out(f"• {found.job_reach}", markup=False)
    if found.spec_changes:
        ui.out("the spec changed since the last `invoke up` of this running cluster:")
        for change in found.spec_changes:
            ui.out(f"  {change.describe()}", markup=False)
    _print_plan_files(found)
    from rich.markup import escape

    for problem in result.problems:
        ui.info(f"[red]✗[/red] {escape(problem)}")


def _print_plan_files(found: PlanResult) -> None:
    """Where the files went and how they differ from the last `up`'s."""
    changes = found.spec_changes
    ui.out(f"rendered: {', '.join(str(found.rendered / f) for f in sorted(found.plan.files)) or 'nothing'}")
    if found.diff:
        ui.out("changes since the last `invoke up`:")
        ui.out(found.diff, markup=False, highlight=False)
    elif found.applied and any(not c.applied for c in changes):
        # `up` keeps what it rendered even when the running cluster could not take all of it.
        ui.out("the rendered files are those of the last `invoke up`, but the running cluster "
               "does not have the changes above that need a new cluster")
    elif found.applied and changes:
        # The spec's fields above are settings `up` applies in place, not a rendered file.
        ui.out("the rendered files are those of the last `invoke up`; `invoke up` applies the "
               "spec changes above to the running cluster")
    elif found.applied:
        ui.out("no changes since the last `invoke up`")
    else:
        ui.out("nothing applied yet")


class PlanProblemsError(RayfleetError):
    """A pre-flight check of `plan` failed: `up` would fail the same way."""


def _refuse_problems(result: Plan[Any]) -> None:
    count = len(result.problems)
    if count:
        raise PlanProblemsError(f"{count} pre-flight check{'s' if count > 1 else ''} failed (above); "
                                "fix them before `invoke up`")


def up(provider: str | None, cluster: str | None, keep_partial: bool) -> None:
    from infra.app import lifecycle

    membership.refuse_owner_verb(cluster, "up")
    done = lifecycle.up(loading.resolve(provider, cluster), common.Shown(), keep_partial)
    selected, endpoint = done.spec, done.endpoint
    flag = common.cluster_flag(selected)
    for change in done.pending:
        ui.warn(f"{selected.source}: {change.field} changed to {json.dumps(change.after)}, but "
                f"the running cluster keeps {json.dumps(change.before)}: it needs a new cluster "
                f"(`invoke teardown{flag}`, then `invoke up{flag}`)")
    ui.out(f"cluster {selected.name!r} ({selected.provider}) is up")
    if done.in_place:
        ui.out(done.in_place, markup=False)
    ui.out(f"  Ray address:  {endpoint.address}", markup=False)
    ui.out(f'  Ray\'s tools:  eval "$(invoke env{flag})"   (ray status, ray job submit, '
           "ray.init())", markup=False)
    ui.out(f"  dashboard:    {endpoint.dashboard_url}   (`invoke dashboard{flag}`)", markup=False)
    ui.out(f"  submit a job: invoke submit{flag} examples/cpu_example.py -- 8", markup=False)
    ui.out(f"  tear down:    invoke teardown{flag}", markup=False)
    if done.gateway_url:
        ui.out(f"  members:      {done.gateway_url}   (`invoke member-add{flag} NAME`)",
               markup=False)
    ui.out(f"  {costs.describe_autodown(selected)}", markup=False)


@contextmanager
def connect(provider: str | None, cluster: str | None) -> Iterator[Endpoint]:
    """The running cluster's endpoint for the length of a `with` block (a tunnel if remote);
    also used beyond the tasks, e.g. by the Hydra launcher in examples/hydra_plugins/. A cluster
    joined as a member (`invoke join`) is reached through its gateway."""
    if membership.joined(cluster):
        yield membership.endpoint(str(cluster))
        return
    with clusters.connect(loading.resolve(provider, cluster)) as endpoint:
        yield endpoint


class RayNotAnsweringError(RayfleetError):
    """The provider reports the cluster running, but Ray's dashboard does not answer."""


def status(provider: str | None, cluster: str | None, as_json: bool) -> int:
    from infra.app import reporting

    found = reporting.status(loading.resolve(provider, cluster), common.Shown())
    if as_json:
        ui.out(json.dumps(_status_as_dict(found), indent=2), soft_wrap=True, markup=False)
        return 1 if found.ray_error else 0
    _print_status(found)
    if found.ray_error:
        raise RayNotAnsweringError(found.ray_error)
    return 0


def _status_as_dict(found: StatusResult) -> dict[str, Any]:
    selected, current, view = found.spec, found.state, found.provider
    return {
        "cluster": selected.name, "provider": selected.provider,
        "cluster_id": current.cluster_id if current.path.exists() else None,
        "running": view.running, "summary": view.summary,
        "provider_resources": view.rows, "warnings": view.warnings,
        "state": view.state_label,
        "cost": view.cost.__dict__ if view.cost else None,
        "autodown": view.autodown.__dict__ if view.autodown else None,
        "ray_error": found.ray_error or None, **found.ray, **found.extras,
        "tracking_copy": found.copy_note, "tracking_copied_at": current.info.tracking_copied_at,
        "job_reach": found.job_reach or None, "sharing_budget": found.budget,
        "sharing": found.sharing,
    }


def _print_status(found: StatusResult) -> None:
    from infra.cli import term as commands_term

    selected, view = found.spec, found.provider
    ui.out(f"{_title(selected)}: {view.summary}", markup=False)
    if view.cost is not None:
        ui.out(f"cost: {costs.describe_cost(view.cost)}", markup=False)
    if view.autodown is not None:
        ui.out(autodown_view.describe(view.autodown), markup=False)
    if found.sharing is not None:
        commands_term.print_status_sharing(selected, found.sharing)
    if found.budget is not None and selected.sharing is not None:
        commands_term.print_budget_status(selected.sharing, found.budget)
    if found.job_reach:
        ui.out(found.job_reach, markup=False)
    common.table("provider resources", view.rows)
    for warning in view.warnings:
        ui.warn(warning)
    if found.ray:
        common.table("Ray nodes", found.ray["nodes"])
        totals = ", ".join(f"{k} {_amount(k, v)}" for k, v in sorted(found.ray["resources"].items()))
        ui.out(f"Ray resources (alive nodes): {totals}", markup=False)
        common.table("jobs", found.ray["jobs"])
    if found.extras:
        from infra.core import serve

        serve.print_status_extras(found.extras)
    if found.copy_note:
        ui.out(found.copy_note, markup=False, soft_wrap=True)


def _title(selected: spec.ClusterSpec) -> str:
    """"name (provider)", or just the name when it is the provider's (its default spec)."""
    if selected.name == selected.provider:
        return selected.name
    return f"{selected.name} ({selected.provider})"


def _amount(key: str, value: float) -> str:
    # Ray counts memory resources in bytes.
    return f"{value / 2**30:.1f} GiB" if "memory" in key else f"{value:g}"


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
    from infra.app import lifecycle

    membership.refuse_owner_verb(cluster, "teardown")
    done = lifecycle.teardown(loading.resolve(provider, cluster), common.Shown())
    if done.tracking_copied is not None:
        ui.out(f"tracking data copied to {done.tracking_copied} (runs, metrics, models, "
               "artifacts)", markup=False, soft_wrap=True)
    if done.metrics_kept is not None:
        ui.out(f"metrics history kept in {done.metrics_kept} (`invoke report` draws it)",
               markup=False, soft_wrap=True)
    if not done.removed:
        ui.out(f"cluster {done.cluster!r}: nothing to tear down")
        return
    ui.out(f"cluster {done.cluster!r} is gone: nothing of it is left")
    if done.kept_store:
        ui.out(f"tracking data kept in {done.kept_store} (runs, metrics, models, artifacts); the "
               "next `invoke up` of this cluster serves it again", markup=False, soft_wrap=True)

"""`member-add`, `member-remove`, `members` (the owner) and `join`, `env` for a member.

The owner's verbs load the spec and need `sharing:` in it; the registry and the gateway's side are
infra/sharing.py. A member's verbs read only what `join` kept (infra/membership.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from infra import auth, costs, jobs, membership, sharing, state, ui
from infra.commands import _cluster_flag, _running, _select
from infra.errors import UsageError
from infra.node import gateway_state
from infra.node.files import atomic_write

MEMBER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def _shared(provider: str | None, cluster: str | None, verb: str) -> Any:
    membership.refuse_owner_verb(cluster, verb)
    selected, impl = _select(provider, cluster)
    sharing.require_sharing(selected)
    return selected, impl


def member_add(provider: str | None, cluster: str | None, name: str, admin: bool,
               expires_days: float | None, out: str | None) -> None:
    selected, impl = _shared(provider, cluster, "member-add")
    if not MEMBER_NAME.fullmatch(name):
        raise UsageError(f"member name {name!r}: use 1-32 lowercase letters, digits, - or _, "
                         "starting with a letter (e.g. alice)")
    if expires_days is not None and expires_days <= 0:
        raise UsageError(f"--expires-days {expires_days:g}: give a positive number of days")
    with state.locked(selected.name, selected.provider, "member-add") as current:
        url = current.info.get("gateway_url")
        if not url or current.empty:
            raise UsageError(f"cluster {selected.name!r} has no gateway yet; run "
                             f"`invoke up{_cluster_flag(selected)}` first")
        members = sharing.read_registry(selected.name)
        if name in members:
            raise UsageError(f"member {name!r} already exists; `invoke member-remove {name}` "
                             "first to give them a new token")
        path = Path(out) if out else Path.cwd() / f"{selected.name}-{name}.rayfleet.json"
        if path.exists():
            raise UsageError(f"--out {path}: the file exists; pick another path or remove it")
        entry, token = sharing.new_member(admin, expires_days)
        entry["address"] = url  # what the bundle names: `up` warns when the gateway moved
        # The bundle first: a member in the registry without a bundle could never log in.
        atomic_write(path, json.dumps(sharing.bundle(selected.name, url, name, token), indent=2),
                     mode=0o600)
        try:
            sharing.write_registry(selected.name, {**members, name: entry})
            sharing.push_registry(selected, impl.head_access(current))
        except BaseException:
            path.unlink(missing_ok=True)
            sharing.write_registry(selected.name, members)
            raise
    ui.out(f"member {name!r} added{' (admin)' if admin else ''}; bundle: {path}", markup=False)
    ui.out(f"send {path.name} privately to {name} and tell them: pip install \"ray[default]\", then "
           f"`invoke join {path.name}` (or see docs/concepts/sharing.md for plain Ray)", markup=False)


def member_remove(provider: str | None, cluster: str | None, name: str, stop_jobs: bool,
                  rotate: bool = False) -> None:
    selected, impl = _shared(provider, cluster, "member-remove")
    with state.locked(selected.name, selected.provider, "member-remove") as current:
        members = sharing.read_registry(selected.name)
        if name not in members:
            known = ", ".join(sorted(members)) or "none"
            raise UsageError(f"no member {name!r} on {selected.name!r} (members: {known})")
        removed = members[name]
        rest = {k: v for k, v in members.items() if k != name}
        sharing.write_registry(selected.name, rest)
        if not current.empty:
            sharing.push_registry(selected, impl.head_access(current))
    ui.out(f"member {name!r} removed: their next request is refused", markup=False)
    if stop_jobs:
        # Their jobs by the gateway's own record of who submitted what (Ray's metadata is not
        # evidence: code inside the cluster can set it on jobs it starts).
        theirs = sharing.member_job_ids(selected, impl, name, removed)
        with impl.connect(_running(selected)) as endpoint:
            for job in jobs.job_client(endpoint).list_jobs():
                job_id = str(job.submission_id or job.job_id)
                if job_id in theirs and str(job.status.value) in ("PENDING", "RUNNING"):
                    ui.out(f"job {job_id} {jobs.stop(endpoint, job_id)}", markup=False)
    if rotate:
        rotate_token(provider, cluster, yes=True)


def rotate_token(provider: str | None, cluster: str | None, yes: bool) -> None:
    """A new Ray token for the cluster: Ray restarts (every node reads it at start), so the old
    token, which every job could read, is refused everywhere. Members' own tokens do not change."""
    membership.refuse_owner_verb(cluster, "rotate-token")
    selected, impl = _select(provider, cluster)
    if selected.auth != "token":
        raise UsageError(f"{selected.source}: auth: none — the cluster has no token to rotate")
    if not yes:
        raise UsageError("rotate-token restarts Ray on the cluster: every running job, actor and "
                         "Serve app ends; add --yes to go on")
    with state.locked(selected.name, selected.provider, "rotate-token") as current:
        if current.empty:
            raise UsageError(f"cluster {selected.name!r} is not running; its next "
                             f"`invoke up{_cluster_flag(selected)}` makes a token")
        ui.warn(f"rotate-token: restarting Ray on {selected.name!r} with a new token; running "
                "jobs, actors and Serve apps end")
        auth.rotate(current)
        impl.restart_ray(current)
        if selected.sharing is not None:
            sharing.ensure_gateway(selected, impl.head_access(current), current)
    ui.out(f"cluster {selected.name!r} has a new Ray token: the old one is refused everywhere; "
           "members' tokens are unchanged", markup=False)


def member_rows(selected: Any, impl: Any, current: Any) -> list[dict[str, Any]]:
    members = sharing.read_registry(selected.name)
    access = None
    if current is not None and not current.empty:
        try:
            access = impl.head_access(current)
        except Exception:  # a head that is gone: the last usage copied here still counts
            access = None
    usage = sharing.read_usage(selected, access)
    # Who submitted what is the gateway's record (usage.json); Ray's own list wins for a recorded
    # job's status and times (a job submitted since the gateway's last tick counts already).
    jobs_seen: dict[str, dict[str, Any]] = {k: dict(v) for k, v in usage.get("jobs", {}).items()}
    if access is not None:
        try:
            with impl.connect(current) as endpoint:
                for job in jobs.job_client(endpoint).list_jobs():
                    key = str(job.submission_id or job.job_id)
                    if key in jobs_seen:
                        jobs_seen[key].update(status=str(job.status.value),
                                              start_time=job.start_time, end_time=job.end_time)
        except Exception:  # Ray not answering: counts from the head's usage file only
            pass
    rows = []
    for name, entry in sorted(members.items()):
        own = [v for v in jobs_seen.values() if sharing.recorded_for(v, name, entry)]
        rows.append({
            "name": name, "role": entry.get("role"), "added": entry.get("added"),
            "expires": entry.get("expires"),
            "last_seen": usage.get("members", {}).get(name, {}).get("last_seen"),
            "running_jobs": sum(1 for v in own if v.get("status") in ("PENDING", "RUNNING")),
            "total_jobs": len(own),
            "job_hours": round(sum(gateway_state.job_hours(v) for v in own), 6),
            "cost_share_usd": round(sum(float(v.get("cost", 0.0)) for v in own), 4),
        })
    return rows


def members(provider: str | None, cluster: str | None, as_json: bool) -> None:
    selected, impl = _shared(provider, cluster, "members")
    rows = member_rows(selected, impl, state.read(selected.name))
    # The copy member_rows just read (from the head when it answers): what the shares add up to.
    found = sharing.read_usage(selected, None).get("cluster") or {}
    cluster_cost = {name: round(float(found.get(name) or 0.0), 4)
                    for name in ("hourly_usd", "accrued_usd", "owner_usd", "idle_usd")}
    # Jobs Ray listed that no member submitted through the gateway: the owner's own, or started
    # inside the cluster (whatever metadata they claim). They count against no member.
    unattributed = len(sharing.read_usage(selected, None).get("unattributed") or {})
    if as_json:
        ui.out(json.dumps({"cluster": selected.name, "members": rows,
                           "cluster_cost": cluster_cost, "unattributed_jobs": unattributed},
                          indent=2), markup=False, soft_wrap=True)
        return
    if not rows:
        ui.out(f"no members on {selected.name!r}; add one with `invoke member-add NAME`")
        return
    from rich.table import Table

    table = Table(title=f"members of {selected.name}")
    for column in rows[0]:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    ui.out(table)
    if unattributed:
        ui.out(f"{unattributed} job(s) not submitted by a member through the gateway (yours, or "
               "started inside the cluster): unattributed, counted against nobody", markup=False)
    if cluster_cost["accrued_usd"] or cluster_cost["hourly_usd"]:
        ui.out(f"cluster cost so far (estimate): {costs.usd(cluster_cost.get('accrued_usd'))} at "
               f"{costs.usd(cluster_cost.get('hourly_usd'))}/h now; each interval split among the "
               f"jobs running then: owner {costs.usd(cluster_cost.get('owner_usd'))}, no job "
               f"running {costs.usd(cluster_cost.get('idle_usd'))}", markup=False)


def join(bundle: str, address: str | None = None) -> None:
    name = membership.join(bundle, address)
    info = membership.describe(name)
    ui.out(f"joined {name!r} as member {info['member']!r} ({info['address']})", markup=False)
    ui.out(f'next: eval "$(invoke env --cluster {name})"; then `ray job submit -- python x.py`, '
           f"or `invoke submit --cluster {name} SCRIPT`", markup=False)


def env(cluster: str) -> None:
    ui.out(membership.exports(cluster), markup=False)
    ui.info(f"# after eval: `ray job submit | list | logs | stop` reach {cluster!r} through its "
            "gateway, as you; other HTTPS keeps verifying against the public CAs")


def status(cluster: str, as_json: bool) -> int:
    """A member's status: the gateway's address and their own jobs."""
    info = membership.describe(cluster)
    endpoint = membership.endpoint(cluster)
    rows = jobs.list_jobs(endpoint)
    if as_json:
        ui.out(json.dumps({**info, "jobs": rows}, indent=2), markup=False, soft_wrap=True)
        return 0
    ui.out(f"{cluster}: member {info['member']} via {info['address']}", markup=False)
    for row in rows:
        ui.out(f"  {row['job']}  {row['status']}  {row['entrypoint']}", markup=False)
    if not rows:
        ui.out("  no jobs of yours yet", markup=False)
    return 0


def dashboard(cluster: str) -> None:
    endpoint = membership.endpoint(cluster)
    ui.out(endpoint.dashboard_url, markup=False)
    ui.info(f"paste your token from {endpoint.token_path} when the dashboard asks; the browser "
            f"must trust the cluster's CA ({membership.folder(cluster) / membership.CA_FILE})")


"""`member-add`, `member-remove`, `members` (the owner) and `join`, `env` for a member.

The owner's verbs load the spec and need `sharing:` in it; the registry and the gateway's side are
infra/core/sharing/owner.py. A member's verbs read only what `join` kept (infra/core/sharing/membership.py).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path
from typing import Any

from infra.cli import common
from infra.core import auth, costs, jobs, spec, state, ui
from infra.core.errors import UsageError
from infra.core.sharing import member_folder, membership, term_people
from infra.core.sharing import owner as sharing
from infra.core.sharing import term as sharing_term
from infra.node.files import atomic_write

MEMBER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def _shared(provider: str | None, cluster: str | None, verb: str) -> Any:
    membership.refuse_owner_verb(cluster, verb)
    selected, impl = common.select(provider, cluster)
    sharing.require_sharing(selected)
    return selected, impl


def member_add(provider: str | None, cluster: str | None, name: str, admin: bool,
               expires_days: float | None, out: str | None) -> None:
    selected, impl = _shared(provider, cluster, "member-add")
    if not MEMBER_NAME.fullmatch(name):
        raise UsageError(f"member name {name!r}: use 1-32 lowercase letters, digits, - or _, "
                         "starting with a letter (e.g. alice)")
    own = expiry_in_days(expires_days)
    with state.locked(selected.name, selected.provider, "member-add") as current:
        url = gateway_url(selected, current)
        members = sharing.read_registry(selected.name)
        if name in members:
            if not sharing_term.is_member(members[name]):
                raise UsageError(f"{name!r} is the owner's own entry on {selected.name!r}; pick "
                                 "another member name")
            raise UsageError(f"member {name!r} already exists; `invoke member-remove {name}` "
                             "first to give them a new token, `invoke member-update "
                             f"{name}` to change their role or expiry")
        target = member_target(out, selected.name, name)
        fresh = not target.exists()  # an earlier folder of theirs is refreshed, never discarded
        entry, path = issue(selected, url, name, "admin" if admin else "member", own, target)
        try:
            everyone = {**members, name: entry}
            sharing_term.apply_ends(everyone, sharing_term.ends_of(selected.sharing))
            sharing.write_registry(selected.name, everyone)
            sharing.push_registry(selected, impl.head_access(current))
        except BaseException:
            if fresh:
                discard(target)
            sharing.write_registry(selected.name, members)
            raise
    ui.out(f"member {name!r} added{' (admin)' if admin else ''}; "
           f"{'bundle' if path == target else 'folder'}: {target}", markup=False)
    if path == target:  # the bundle alone, as asked
        ui.out(f"send {path.name} privately to {name}; they run: rayfleet join {path.name} "
               "(rayfleet: see the README), or see docs/concepts/sharing.md for plain Ray",
               markup=False)
        return
    ui.out(member_folder.send_line(target, name), markup=False)


def expiry_in_days(expires_days: float | None) -> str | None:
    if expires_days is None:
        return None
    if expires_days <= 0:
        raise UsageError(f"--expires-days {expires_days:g}: give a positive number of days")
    return sharing_term.iso(dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=expires_days))


def gateway_url(selected: Any, current: Any) -> str:
    url = current.info.gateway_url
    if not url or current.empty:
        raise UsageError(f"cluster {selected.name!r} has no gateway yet; run "
                         f"`invoke up{common.cluster_flag(selected)}` first")
    return str(url)


def member_target(out: str | None, cluster: str, name: str, parent: bool = False) -> Path:
    """Where a member's files go: `--out DIR` is their folder (with --roster: the folder of every
    member's folder), default ./<cluster>-<name>/; `--out FILE.json` is the bundle alone."""
    folder_name = f"{cluster}-{name}"
    if out is None:
        target = Path.cwd() / folder_name
    elif out.endswith(".json") and not parent:
        target = Path(out)
    else:
        target = Path(out) / folder_name if parent else Path(out)
    # That person's earlier folder is refreshed (their files in it kept); anything else: refused.
    member_folder.same_person(target, cluster, name)
    return target


def issue(selected: Any, url: str, name: str, role: str, own_expires: str | None,
          target: Path) -> tuple[dict[str, Any], Path]:
    """A new member's registry entry (its effective expiry capped by `sharing.ends`) and their
    files at `target` (a folder, or a bundle file when it ends in .json); the bundle's path.
    The files first: a member in the registry without them could never log in."""
    entry, token = sharing.new_member(role == "admin", None)
    sharing_term.set_expiry(entry, own_expires, sharing_term.ends_of(selected.sharing))
    entry["address"] = url  # what the bundle names: `up` warns when the gateway moved
    bundle = sharing.bundle(selected.name, url, name, token)
    if target.suffix == ".json":
        atomic_write(target, json.dumps(bundle, indent=2), mode=0o600)
        return entry, target
    return entry, member_folder.write(target, bundle)


def discard(target: Path) -> None:
    if target.is_dir():
        shutil.rmtree(target, ignore_errors=True)
    else:
        target.unlink(missing_ok=True)


def member_remove(provider: str | None, cluster: str | None, name: str, stop_jobs: bool,
                  rotate: bool = False) -> None:
    selected, impl = _shared(provider, cluster, "member-remove")
    with state.locked(selected.name, selected.provider, "member-remove") as current:
        book = sharing_term.read_book(selected.name)
        check_member(selected, book["members"], name)
        removed = dict(book["members"][name])
        # Kept, marked, without its token's hash: `members` still shows them and their usage.
        sharing_term.remove(book, name, stop_jobs=stop_jobs)
        # The owner's gateway token renewed in the same write: a job running as the owner's
        # account (local, slurm) may have copied it.
        sharing.renew_owner_token(selected.name, book)
        if not current.empty:
            sharing.push_registry(selected, impl.head_access(current))
    ui.out(f"member {name!r} removed: their next request is refused; your own gateway token "
           f"is renewed ({sharing.owner_token_path(selected.name)})", markup=False)
    if stop_jobs:
        try:
            stop_member_jobs(selected, impl, name, removed)
        finally:
            # Once more after their jobs stopped: one of them may have read the new one.
            renew_owner_token(selected, impl)
    if rotate:
        rotate_token(provider, cluster, yes=True)


def renew_owner_token(selected: Any, impl: Any) -> None:
    """The owner's gateway token renewed, and the registry with its hash where the gateway reads
    it: a copy of the old one (where jobs run as the owner's account, a job can read it) is
    refused from the gateway's next request on."""
    with state.locked(selected.name, selected.provider, "renew the owner's gateway token") \
            as current:
        sharing.renew_owner_token(selected.name)
        if not current.empty:
            sharing.push_registry(selected, impl.head_access(current))


def stop_member_jobs(selected: Any, impl: Any, name: str, removed: dict[str, Any]) -> None:
    """Their jobs by the gateway's own record of who submitted what (Ray's metadata is not
    evidence: code inside the cluster can set it on jobs it starts)."""
    theirs = sharing.member_job_ids(selected, impl, name, removed)
    with impl.connect(common.running(selected)) as endpoint:
        for job in jobs.job_client(endpoint).list_jobs():
            job_id = str(job.submission_id or job.job_id)
            if job_id in theirs and str(job.status.value) in ("PENDING", "RUNNING"):
                ui.out(f"job {job_id} {jobs.stop(endpoint, job_id)}", markup=False)


def rotate_token(provider: str | None, cluster: str | None, yes: bool) -> None:
    """A new Ray token for the cluster: Ray restarts (every node reads it at start), so the old
    token, which every job could read, is refused everywhere. Members' own tokens do not change."""
    membership.refuse_owner_verb(cluster, "rotate-token")
    selected, impl = common.select(provider, cluster)
    if selected.auth != "token":
        raise UsageError(f"{selected.source}: auth: none — the cluster has no token to rotate")
    if not yes:
        raise UsageError("rotate-token restarts Ray on the cluster: every running job, actor and "
                         "Serve app ends; add --yes to go on")
    with state.locked(selected.name, selected.provider, "rotate-token") as current:
        if current.empty:
            raise UsageError(f"cluster {selected.name!r} is not running; its next "
                             f"`invoke up{common.cluster_flag(selected)}` makes a token")
        ui.warn(f"rotate-token: restarting Ray on {selected.name!r} with a new token; running "
                "jobs, actors and Serve apps end")
        auth.rotate(current)
        try:
            impl.restart_ray(current, common.Shown())
        finally:
            if selected.sharing is not None:
                # On every provider, Ray restarted or not (after the restart: no job left that
                # could read the new one); the old one, which a job may have copied where jobs
                # run as the owner's account, is refused from the gateway's next request on.
                sharing.renew_owner_token(selected.name)
                sharing.push_registry(selected, impl.head_access(current))
        if selected.sharing is not None:
            sharing.ensure_gateway(selected, impl.head_access(current), current, None,
                                   common.Shown())
    ui.out(f"cluster {selected.name!r} has a new Ray token: the old one is refused everywhere; "
           "members' tokens are unchanged" + ("; your own gateway token is renewed"
                                               if selected.sharing is not None else ""),
           markup=False)


def check_member(selected: Any, members: dict[str, dict[str, Any]], name: str) -> None:
    """One line unless `name` is a current member (the owner's own entry is none)."""
    if name in members and sharing_term.is_member(members[name]):
        return
    known = ", ".join(sorted(k for k, v in members.items() if sharing_term.is_member(v))) or "none"
    raise UsageError(f"no member {name!r} on {selected.name!r} (members: {known})")


def member_rows(selected: Any, impl: Any, current: Any) -> list[dict[str, Any]]:
    """One row per member, current, expired and removed (the owner's own entry is none)."""
    book = sharing_term.read_book(selected.name)
    access = None
    if current is not None and not current.empty:
        try:
            access = impl.head_access(current)
        except Exception:  # a head that is gone: the last usage copied here still counts
            access = None
    usage = sharing.read_usage(selected, access)
    # Who submitted what is the gateway's record (usage.json); Ray's own list wins for a recorded
    # job's status and times (a job submitted since the gateway's last tick counts already).
    jobs_seen = sharing.job_records(usage)
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
    return sharing_term.rows_of(book, usage, jobs_seen, selected.sharing)


def members(provider: str | None, cluster: str | None, as_json: bool) -> None:
    selected, impl = _shared(provider, cluster, "members")
    rows = member_rows(selected, impl, state.read(selected.name))
    # The copy member_rows just read (from the head when it answers): what the shares add up to.
    usage = sharing.read_usage(selected, None)
    found = usage.get("cluster") or {}
    cluster_cost = {name: round(float(found.get(name) or 0.0), 4)
                    for name in ("hourly_usd", "accrued_usd", "owner_usd", "idle_usd")}
    budget = sharing_term.cluster_budget(selected.sharing, usage)
    # Jobs Ray listed that no member submitted through the gateway: the owner's own, or started
    # inside the cluster (whatever metadata they claim). They count against no member.
    unattributed = len(usage.get("unattributed") or {})
    # One row per person: a name removed and added again is one person, their history nested.
    persons = term_people.people(rows, selected.sharing)
    if as_json:
        ui.out(json.dumps({"cluster": selected.name, "members": persons,
                           "cluster_cost": cluster_cost, "unattributed_jobs": unattributed,
                           "cluster_budget": budget}, indent=2), markup=False, soft_wrap=True)
        return
    if not rows:
        ui.out(f"no members on {selected.name!r}; add one with "
               f"`invoke member-add NAME{common.cluster_flag(selected)}`")
        return
    ui.out(f"members of {selected.name}", markup=False)
    for line in term_people.table_lines(persons, selected.sharing):
        ui.out(line, markup=False, soft_wrap=True)
    if unattributed:
        ui.out(f"{unattributed} job(s) not submitted by a member through the gateway (yours, or "
               "started inside the cluster): unattributed, counted against nobody", markup=False)
    if cluster_cost["accrued_usd"] or cluster_cost["hourly_usd"]:
        ui.out(f"cluster cost so far (estimate): {costs.usd(cluster_cost.get('accrued_usd'))} at "
               f"{costs.usd(cluster_cost.get('hourly_usd'))}/h now; each interval split among the "
               f"jobs running then: owner {costs.usd(cluster_cost.get('owner_usd'))}, no job "
               f"running {costs.usd(cluster_cost.get('idle_usd'))}", markup=False)
    warn_budgets(selected.sharing, persons, budget)


def warn_budgets(spec_sharing: Any, rows: list[dict[str, Any]],
                 budget: dict[str, Any] | None) -> None:
    """One line per member, and one for the cluster, at or past 80 % of a budget."""
    for row in rows:
        if row["status"] != "removed" and (row["budget_used"] or 0) >= sharing_term.WARN_AT:
            ui.warn(sharing_term.describe_member_budget(spec_sharing, row["name"],
                                                        row["job_hours"], row["cost_share_usd"]))
    if budget is not None:
        line = sharing_term.describe_cluster_budget(budget)
        if budget["used"] >= sharing_term.WARN_AT:
            ui.warn(line)
        else:
            ui.out(line, markup=False)


def join(bundle: str, address: str | None = None) -> None:
    name = membership.join(bundle, address)
    info = membership.describe(name)
    ui.out(f"joined {name!r} as member {info['member']!r} ({info['address']})", markup=False)
    visible = spec.spec_path(name)
    if visible.exists():
        # The cluster joined wins over a spec of that name (a class's repository may ship it).
        ui.warn(f"{visible} has the same name: `--cluster {name}` now means the cluster you "
                f"joined; give the spec's path to use the spec")
    ui.out(f'next: eval "$(rayfleet env --cluster {name})"; then '
           f"`ray job submit --working-dir . -- python x.py`, or "
           f"`rayfleet submit --cluster {name} SCRIPT`", markup=False)


def env(cluster: str) -> None:
    ui.out(membership.exports(cluster), markup=False)
    ui.info(f"# after eval: `ray job submit | list | logs | stop` reach {cluster!r} through its "
            "gateway, as you; other HTTPS keeps verifying against the public CAs")


def status(cluster: str, as_json: bool) -> int:
    """A member's status: the gateway's address and their own jobs."""
    info = membership.describe(cluster)
    endpoint = membership.endpoint(cluster)
    rows = jobs.list_jobs(endpoint, why_stopped=True)
    if as_json:
        ui.out(json.dumps({**info, "jobs": rows}, indent=2), markup=False, soft_wrap=True)
        return 0
    ui.out(f"{cluster}: member {info['member']} via {info['address']}", markup=False)
    for row in rows:
        why = f"  ({row['stopped']})" if row["stopped"] else ""
        ui.out(f"  {row['job']}  {row['status']}  {row['entrypoint']}{why}", markup=False)
    if not rows:
        ui.out("  no jobs of yours yet", markup=False)
    return 0


def dashboard(cluster: str) -> None:
    endpoint = membership.endpoint(cluster)
    ui.out(endpoint.dashboard_url, markup=False)
    ui.info(f"paste your token from {endpoint.token_path} when the dashboard asks; the browser "
            f"must trust the cluster's CA ({membership.folder(cluster) / membership.CA_FILE})")


"""A term with a class, the owner's side: the registry's whole file, expiry and the class's end,
the roster, and budgets as `members` and `status` show them.

The registry (`members.json`, infra/core/sharing/owner.py) keeps the members the gateway reads under
`members`; a removed member moves to the section `removed` (a list, so one name may be removed
more than once), their token's hash renamed `revoked_sha256`: the gateway accepts tokens from
`members` only, so no removed member's token is ever accepted; it reads `removed` only to name the
person it refuses ("member bob was removed ... on DATE") and to stop their jobs after
`--stop-jobs` (infra/node/gateway_removed.py), and `members` still shows them with their usage.
Any other section or field (the gateway's own, a later version's) is kept as it is.

Expiry: each entry keeps the member's own expiry (`member_expires`) and the effective one
(`expires`, what the gateway checks): the earlier of theirs and the spec's `sharing.ends`.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.core import paths
from infra.core.errors import RayfleetError, UsageError
from infra.core.spec import Sharing
from infra.node import gateway_files, gateway_state, wire
from infra.node.files import atomic_write

#: The section of members.json that the gateway does not read.
REMOVED = "removed"
#: Roles a member may have (the owner's own entry has role `owner` and is no member).
ROLES = ("member", "admin")
OWNER_ROLE = "owner"
#: From this share of a budget on, `members` and `status` warn.
WARN_AT = 0.8
ROSTER_COLUMNS = ("name", "role", "expires")
MEMBER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


class RegistryError(RayfleetError):
    """The registry file cannot be read as a registry."""


def registry_path(cluster: str) -> Path:
    return paths.home() / "sharing" / cluster / gateway_state.MEMBERS_FILE


def read_book(cluster: str) -> dict[str, Any]:
    """The registry's whole file: `members` (a dict, possibly empty) and every other section,
    read through its typed form (infra/node/gateway_files.py) and handed on as its JSON object:
    the verbs move entries between sections as they are."""
    path = registry_path(cluster)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"members": {}}
    except ValueError:
        raise RegistryError(f"{path} is not valid JSON; restore it from a backup or remove it "
                            "(every member then needs a new bundle)") from None
    if not isinstance(data, dict):
        raise RegistryError(f"{path} is not a registry (not a JSON object); restore it from a "
                            "backup or remove it")
    return gateway_files.MembersFile.from_dict(data).to_dict()


def write_book(cluster: str, book: dict[str, Any]) -> None:
    """The registry as the gateway reads it (gateway_files.MembersFile), saying this code's
    version (a newer one's number kept: its keys are kept too)."""
    target = registry_path(cluster)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.parent.chmod(0o700)
    typed = gateway_files.MembersFile.from_dict(book)
    typed = dataclasses.replace(typed, version=max(typed.version, wire.VERSION))
    atomic_write(target, json.dumps(typed.to_dict(), indent=2, sort_keys=True), mode=0o600)


def is_member(entry: dict[str, Any]) -> bool:
    """A member of the class: not the owner's own entry."""
    return entry.get("role") != OWNER_ROLE


def removed_entries(book: dict[str, Any]) -> list[dict[str, Any]]:
    found = book.get(REMOVED)
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def remove(book: dict[str, Any], name: str, when: str | None = None,
           stop_jobs: bool = False) -> None:
    """Move `name` from `members` to `removed`, its token's hash as `revoked_sha256` (the gateway
    accepts `members` only: the token is refused from the next request on, with their name);
    `stop_jobs`: the gateway stops their jobs, recording why."""
    entry = dict(book["members"].pop(name))
    digest = entry.pop("token_sha256", None)
    if digest:
        entry["revoked_sha256"] = digest
    entry.update(name=name, removed=when or gateway_state.now_iso())
    if stop_jobs:
        entry["stop_jobs"] = True
    book[REMOVED] = [*removed_entries(book), entry]


# --- dates -------------------------------------------------------------------------------------

def moment(value: dt.date | dt.datetime) -> dt.datetime:
    """A spec's or a roster's date as the instant access ends: a date is the end of that day
    (UTC), a datetime without an offset is UTC."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return dt.datetime.combine(value + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc)


def iso(value: dt.datetime) -> str:
    return value.astimezone(dt.timezone.utc).isoformat(timespec="seconds")


def shown(instant: str | None) -> str | None:
    """A stored instant as a person reads it, in UTC to the minute: `2026-11-27 23:59 UTC`. The
    instant that ends a day the owner gave as a date is stored as the next midnight, which read
    raw says a day too late (`--expires 2026-11-27` stored as 2026-11-28T00:00:00): it reads as
    the last minute of the day typed. JSON keeps the stored ISO 8601 instant."""
    if not instant:
        return instant
    try:
        value = dt.datetime.fromisoformat(instant)
    except ValueError:
        return instant
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    value = value.astimezone(dt.timezone.utc)
    if value.time() == dt.time():
        value -= dt.timedelta(minutes=1)
    return value.strftime("%Y-%m-%d %H:%M UTC")


def in_past(instant: str | None) -> bool:
    """Whether a stored expiry is already over (the member is refused from now on)."""
    return bool(instant) and dt.datetime.fromisoformat(str(instant)) <= \
        dt.datetime.now(dt.timezone.utc)


def parse_expires(text: str, what: str) -> str | None:
    """`--expires` or a roster cell: a date (the end of that day, UTC), an ISO datetime, or
    `never`; the instant as stored. `what` names the field in the error."""
    text = text.strip()
    if text.lower() == "never":
        return None
    try:
        value: dt.date = dt.datetime.fromisoformat(text) if ("T" in text or " " in text) \
            else dt.date.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{what} {text!r}: give a date like 2026-12-18 (access ends at the end "
                         "of that day, UTC), a datetime like 2026-12-18T17:00:00+01:00, or never")\
            from None
    return iso(moment(value))


def ends_of(sharing: Sharing | None) -> str | None:
    """The class's end (`sharing.ends`) as stored, or None."""
    return iso(moment(sharing.ends)) if sharing is not None and sharing.ends else None


def earliest(*values: str | None) -> str | None:
    found = [v for v in values if v]
    return min(found, key=dt.datetime.fromisoformat) if found else None


def own_expiry(entry: dict[str, Any]) -> str | None:
    """The member's own expiry (entries written before `member_expires` existed: `expires`)."""
    return entry.get("member_expires") if "member_expires" in entry else entry.get("expires")


def set_expiry(entry: dict[str, Any], own: str | None, ends: str | None) -> bool:
    """Set an entry's own and effective expiry; whether anything changed."""
    before = (entry.get("member_expires"), entry.get("expires"), "member_expires" in entry)
    entry["member_expires"] = own
    entry["expires"] = earliest(own, ends)
    return before != (entry["member_expires"], entry["expires"], True)


def apply_ends(members: dict[str, dict[str, Any]], ends: str | None) -> bool:
    """Every member's effective expiry: the earlier of theirs and `ends`; whether any changed."""
    changed = False
    for entry in members.values():
        if is_member(entry):
            changed = set_expiry(entry, own_expiry(entry), ends) or changed
    return changed


def expired(entry: dict[str, Any], now: dt.datetime | None = None) -> bool:
    expires = entry.get("expires")
    if not expires:
        return False
    return dt.datetime.fromisoformat(str(expires)) <= (now or dt.datetime.now(dt.timezone.utc))


def status_of(entry: dict[str, Any]) -> str:
    if entry.get("removed"):
        return "removed"
    return "expired" if expired(entry) else "active"


# --- the roster --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RosterRow:
    line: int
    name: str
    role: str
    #: The member's own expiry as stored (None: none of their own).
    expires: str | None
    #: The row's own expires cell ("": empty, the default taken, which moves with time).
    expires_cell: str = ""


def read_roster(path: Path, default_expires: str | None) -> list[RosterRow]:
    """A CSV roster with the header `name,role,expires` (role and expires may be left out or
    empty: member, and `default_expires`). Every problem is one line naming the file and row."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's export may start with a BOM
    except FileNotFoundError:
        raise UsageError(f"--roster {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--roster {path}: cannot read it as UTF-8 text ({exc})") from None
    reader = csv.reader(text.splitlines())
    header = [h.strip().lower() for h in next(reader, [])]
    if "name" not in header:
        raise UsageError(f"--roster {path}: the first line must name the columns, e.g. "
                         "name,role,expires")
    for column in header:
        if column not in ROSTER_COLUMNS:
            raise UsageError(f"--roster {path}: column {column!r} is not one of "
                             f"{', '.join(ROSTER_COLUMNS)}; remove or rename it")
    if len(set(header)) != len(header):
        raise UsageError(f"--roster {path}: a column appears twice in the header")
    rows: list[RosterRow] = []
    seen: dict[str, int] = {}
    for number, cells in enumerate(reader, start=2):
        if not any(c.strip() for c in cells):
            continue
        if len(cells) > len(header):
            raise UsageError(f"--roster {path}, line {number}: {len(cells)} cells for "
                             f"{len(header)} columns; quote a cell that holds a comma")
        row = {column: (cells[i].strip() if i < len(cells) else "")
               for i, column in enumerate(header)}
        where = f"--roster {path}, line {number}"
        name = row["name"]
        if not MEMBER_NAME.fullmatch(name):
            raise UsageError(f"{where}: name {name!r}: use 1-32 lowercase letters, digits, - or _, "
                             "starting with a letter (e.g. alice)")
        if name in seen:
            raise UsageError(f"{where}: {name!r} is already on line {seen[name]}; keep one row "
                             "per member")
        seen[name] = number
        role = row.get("role") or "member"
        if role not in ROLES:
            raise UsageError(f"{where}: role {role!r}: give member or admin (empty: member)")
        cell = row.get("expires") or ""
        expires = parse_expires(cell, f"{where}: expires") if cell else default_expires
        rows.append(RosterRow(number, name, role, expires, cell))
    if not rows:
        raise UsageError(f"--roster {path}: no members listed (one row per member below the "
                         "header name,role,expires)")
    return rows


# --- budgets -----------------------------------------------------------------------------------

def member_budget(sharing: Sharing | None, job_hours: float, cost_usd: float) -> float | None:
    """The largest share of a member budget used (1.0 = all of it), None without budgets."""
    if sharing is None:
        return None
    used = [spent / limit for spent, limit in ((job_hours, sharing.member_budget_hours),
                                               (cost_usd, sharing.member_budget_usd)) if limit]
    return max(used) if used else None


def describe_member_budget(sharing: Sharing, name: str, job_hours: float, cost_usd: float) -> str:
    parts = []
    if sharing.member_budget_hours:
        parts.append(f"{job_hours:.2f} of {sharing.member_budget_hours:g} job-hours")
    if sharing.member_budget_usd:
        parts.append(f"${cost_usd:.2f} of ${sharing.member_budget_usd:g}")
    used = member_budget(sharing, job_hours, cost_usd) or 0.0
    past = "has used all of" if used >= 1 else f"has used {used:.0%} of"
    then = ": their next submit is refused" if used >= 1 else ""
    return f"member {name} {past} their budget ({', '.join(parts)}){then}"


def cluster_budget(sharing: Sharing | None, usage: dict[str, Any]) -> dict[str, Any] | None:
    """The cluster's budget against its accrued cost (the gateway's usage), None without one."""
    if sharing is None or not sharing.budget_usd:
        return None
    cluster = usage.get("cluster") or {}
    accrued = float(cluster.get("accrued_usd") or 0.0)
    return {"budget_usd": sharing.budget_usd, "accrued_usd": round(accrued, 4),
            "used": round(accrued / sharing.budget_usd, 4),
            "reached_at": cluster.get("budget_reached_at")}


def describe_cluster_budget(found: dict[str, Any]) -> str:
    used = found["used"]
    text = (f"cluster budget: ${found['accrued_usd']:.2f} of ${found['budget_usd']:g} "
            f"({used:.0%}, estimate)")
    if used >= 1 or found.get("reached_at"):
        return text + (": spent; the gateway stopped every job and takes no new one, and "
                       "autodown takes the idle cluster down")
    if used >= WARN_AT:
        return text + (": at 100 % the gateway stops every job and takes no new one, and "
                       "autodown takes the cluster down")
    return text


# --- the rows of `members` ----------------------------------------------------------------------

def rows_of(book: dict[str, Any], usage: dict[str, Any],
            jobs_seen: dict[str, gateway_files.JobRecord],
            spec_sharing: Sharing | None) -> list[dict[str, Any]]:
    """The rows `members` shows, from the registry's whole file and the jobs seen."""
    people = [{**entry, "name": name} for name, entry in book["members"].items()
              if is_member(entry)] + removed_entries(book)
    # One name's entries oldest first: the removed ones (by when added), then the current one.
    people.sort(key=lambda e: (str(e.get("name")), not e.get("removed"), str(e.get("added") or "")))
    owned = _jobs_by_person(people, jobs_seen)
    rows = []
    for index, person in enumerate(people):
        own = owned[index]
        hours = round(sum(gateway_state.job_hours(v) for v in own), 6)
        cost = round(sum(float(v.cost) for v in own), 4)
        name = str(person["name"])
        latest = not any(p["name"] == name for p in people[index + 1:])
        # `isolation: cluster`: the member's own cluster's node time and cost are theirs (and
        # what their budget counts, as the gateway does); the gateway records no job of theirs.
        cluster = (usage.get("member_clusters") or {}).get(str(person.get("id") or ""))
        if isinstance(cluster, dict):
            hours = round(hours + float(cluster.get("hours") or 0.0), 6)
            cost = round(cost + float(cluster.get("usd") or 0.0), 4)
        used = member_budget(spec_sharing, hours, cost)
        rows.append({
            "name": name, "role": person.get("role"), "status": status_of(person),
            "added": person.get("added"), "expires": person.get("expires"),
            "removed": person.get("removed"),
            "last_seen": usage.get("members", {}).get(name, {}).get("last_seen") if latest
            else None,
            "running_jobs": sum(1 for v in own if v.status in ("PENDING", "RUNNING")),
            "total_jobs": len(own), "job_hours": hours, "cost_share_usd": cost,
            "budget_used": None if used is None else round(used, 4),
            **({"cluster": cluster} if isinstance(cluster, dict) else {}),
        })
    return rows


def _jobs_by_person(people: list[dict[str, Any]],
                    jobs_seen: dict[str, gateway_files.JobRecord]
                    ) -> list[list[gateway_files.JobRecord]]:
    """Each job the gateway recorded to the entry it was submitted under: by the member id the
    gateway wrote with it (a name added again is another entry, with another id). Entries and
    records from before ids carry none (`legacy-<name>`): among several such entries of one name,
    the last one added before the job started, and the newest for a job not started yet."""
    owned: list[list[gateway_files.JobRecord]] = [[] for _ in people]
    for job in jobs_seen.values():
        name = str(job.member or "")
        wanted = job.member_id or gateway_state.legacy_id(name)
        mine = [i for i, p in enumerate(people) if p["name"] == name
                and (p.get("id") or gateway_state.legacy_id(name)) == wanted]
        if not mine:
            continue
        start = job.start_time
        pick = mine[-1]
        if len(mine) > 1 and start is not None:
            started = dt.datetime.fromtimestamp(float(start) / 1000, dt.timezone.utc)
            before = [i for i in mine if people[i].get("added") and
                      dt.datetime.fromisoformat(str(people[i]["added"])) <= started]
            pick = (before or mine[:1])[-1]
        owned[pick].append(job)
    return owned

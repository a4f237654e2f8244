"""One person, one row, for the term: a name's registry entries (added, removed, added again)
folded into one row with its history, as `members`, `status` and the report show it.

`term.rows_of` gives one row per registry entry (a name removed and added again is two entries,
with two ids: the gateway keeps their jobs apart). A person's usage and budget are the sum over
their entries: a budget is per person per term, so a removal and re-add starts nothing anew.
"""

from __future__ import annotations

import textwrap
from typing import Any

from infra.core.sharing import term as sharing_term
from infra.core.spec import Sharing

#: The widest line `members` prints (a terminal of 100 columns shows it whole).
WIDTH = 100


def hours(value: float | None) -> str:
    return f"{float(value or 0.0):.2f} h"


def usd(value: float | None) -> str:
    return f"${float(value or 0.0):.2f}"


def history(entries: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A person's events oldest first: added, removed, re-added, expired, with ISO instants."""
    events: list[dict[str, str]] = []
    for index, entry in enumerate(entries):
        if entry.get("added"):
            events.append({"event": "re-added" if index else "added", "at": str(entry["added"])})
        if entry.get("removed"):
            events.append({"event": "removed", "at": str(entry["removed"])})
        elif entry.get("status") == "expired" and entry.get("expires"):
            events.append({"event": "expired", "at": str(entry["expires"])})
    return events


def people(rows: list[dict[str, Any]], spec_sharing: Sharing | None) -> list[dict[str, Any]]:
    """`rows_of`'s rows (one per entry, a name's oldest first) as one row per person: the latest
    entry's role, status and expiry; jobs, hours and cost summed over every entry; the budget
    used from those sums; `history` the events with their dates."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_name.setdefault(str(row["name"]), []).append(row)
    found = []
    for name, entries in by_name.items():
        latest = entries[-1]
        job_hours = round(sum(float(e.get("job_hours") or 0.0) for e in entries), 6)
        cost = round(sum(float(e.get("cost_share_usd") or 0.0) for e in entries), 4)
        used = sharing_term.member_budget(spec_sharing, job_hours, cost)
        found.append({
            "name": name, "role": latest.get("role"), "status": latest.get("status"),
            "added": entries[0].get("added"), "expires": latest.get("expires"),
            "removed": latest.get("removed"), "last_seen": latest.get("last_seen"),
            "running_jobs": sum(int(e.get("running_jobs") or 0) for e in entries),
            "total_jobs": sum(int(e.get("total_jobs") or 0) for e in entries),
            "job_hours": job_hours, "cost_share_usd": cost,
            "budget_used": None if used is None else round(used, 4),
            "history": history(entries),
            **({"cluster": latest["cluster"]} if latest.get("cluster") else {}),
        })
    return found


def budget_of(spec_sharing: Sharing | None) -> str:
    """What a member's budget is, as the budget column's cells say it (`of 20 h / $5`)."""
    if spec_sharing is None:
        return ""
    parts = []
    if spec_sharing.member_budget_hours:
        parts.append(f"{spec_sharing.member_budget_hours:g} h")
    if spec_sharing.member_budget_usd:
        parts.append(f"${spec_sharing.member_budget_usd:g}")
    return " / ".join(parts)


def history_line(person: dict[str, Any]) -> str:
    """The nested line under a person's row: their events, and when the gateway last saw them."""
    said = [f"{e['event']} {sharing_term.shown(e['at'])}" for e in person["history"]]
    if person.get("last_seen"):
        said.append(f"last seen {sharing_term.shown(str(person['last_seen']))}")
    if person.get("cluster"):
        said.append(cluster_words(person["cluster"]))
    return ", ".join(said)


def cluster_words(cluster: dict[str, Any]) -> str:
    """A member's own cluster (`isolation: cluster`): running or stopped, since when, why."""
    since = sharing_term.shown(str(cluster["since"])) if cluster.get("since") else "never run"
    why = f" ({cluster['reason']})" if cluster.get("state") == "stopped" and \
        cluster.get("reason") else ""
    return f"own cluster {cluster.get('state') or 'stopped'} since {since}{why}"


COLUMNS = (("name", 12), ("role", 6), ("status", 7), ("expires", 20), ("jobs", 5),
           ("hours", 9), ("cost", 8), ("budget used", 20))


def table_lines(persons: list[dict[str, Any]], spec_sharing: Sharing | None) -> list[str]:
    """`members` as plain lines at most WIDTH columns wide: a row per person, their history
    nested under it."""
    limits = budget_of(spec_sharing)
    shown = [c for c in COLUMNS if c[0] != "budget used" or limits]

    def line(cells: list[str]) -> str:
        return "  ".join(cell[:width].ljust(width) for cell, (_, width) in
                         zip(cells, shown, strict=False)).rstrip()

    lines = [line([name for name, _ in shown])]
    for p in persons:
        used = p["budget_used"]
        cells = [p["name"], str(p.get("role") or ""), str(p["status"]),
                 sharing_term.shown(p.get("expires")) or "never",
                 f"{p['running_jobs']}/{p['total_jobs']}" if p["running_jobs"]
                 else str(p["total_jobs"]),
                 hours(p["job_hours"]), usd(p["cost_share_usd"]),
                 "" if used is None else f"{used:.0%} of {limits}"]
        lines.append(line(cells))
        nested = history_line(p)
        if nested:
            lines += textwrap.wrap(nested, WIDTH, initial_indent="  └ ",
                                   subsequent_indent="    ")
    return lines

"""`member-add --roster FILE.csv` and `member-update`: a class's members for a term.

Both change the registry under the cluster's lock and push it to the head as `member-add` does
(infra/cli/sharing.py); neither gives an existing member a new token. The registry's
sections, expiry and the roster's format are infra/core/sharing/term.py.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from infra.cli import common
from infra.cli.sharing import (
    _shared,
    check_member,
    discard,
    expiry_in_days,
    gateway_url,
    issue,
    member_target,
)
from infra.core import state, ui
from infra.core.errors import UsageError
from infra.core.sharing import member_folder
from infra.core.sharing import owner as sharing
from infra.core.sharing import term as sharing_term
from infra.node.files import atomic_write


def member_add_roster(provider: str | None, cluster: str | None, roster: str, out: str | None,
                      expires_days: float | None, admin: bool, readd: bool = False) -> None:
    """Add every member of the roster who is not a member yet, each with a folder of their own
    in `out`; members already there keep their token and are reported unchanged. The roster
    never undoes the owner: a removed member is skipped and named (`readd`, or `member-add
    NAME`, brings them back), an expired one is named and not renewed."""
    selected, impl = _shared(provider, cluster, "member-add")
    if admin:
        raise UsageError("--admin with --roster: write admin in the roster's role column of each "
                         "admin instead")
    if out is not None and out.endswith(".json"):
        raise UsageError(f"--out {out}: with --roster give a folder; each member's folder "
                         f"({selected.name}-NAME/) goes in it")
    rows = sharing_term.read_roster(Path(roster), expiry_in_days(expires_days))
    ends = sharing_term.ends_of(selected.sharing)
    flag = common.cluster_flag(selected)
    with state.locked(selected.name, selected.provider, "member-add") as current:
        url = gateway_url(selected, current)
        book = sharing_term.read_book(selected.name)
        members: dict[str, dict[str, Any]] = book["members"]
        for row in rows:
            if row.name in members and not sharing_term.is_member(members[row.name]):
                raise UsageError(f"--roster {roster}, line {row.line}: {row.name!r} is the owner's "
                                 "own entry; pick another member name")
        removed = {str(e.get("name")): e for e in sharing_term.removed_entries(book)}
        skipped = [row for row in rows if row.name not in members and row.name in removed
                   and not readd]
        new = [row for row in rows if row.name not in members and row not in skipped]
        # Every folder's place checked before anything is written.
        targets = {row.name: member_target(out, selected.name, row.name, parent=True)
                   for row in new}
        said = _add_rows(selected, impl, current, url, book, new, targets, set(removed))
    said += [_skipped(row, removed[row.name], roster, flag) for row in skipped]
    for row in rows:
        if row.name in members and row.name not in targets:
            said.append(_unchanged(row, members[row.name], ends, flag))
    for line in said:
        ui.out(line, markup=False)
    for row in new:
        if sharing_term.in_past(members[row.name].get("expires")):
            ui.warn(f"--roster {roster}, line {row.line}: {row.name}'s access ended already "
                    f"({sharing_term.shown(members[row.name]['expires'])}): they are refused")
    listed = {row.name for row in rows}
    others = sorted(n for n, e in members.items() if sharing_term.is_member(e) and n not in listed)
    if others:
        ui.info(f"members not on the roster, kept: {', '.join(others)} "
                f"(`invoke member-remove NAME{flag}` removes one)")
    ui.out(f"roster: {len(new)} added, {len(rows) - len(new) - len(skipped)} unchanged, "
           f"{len(skipped)} removed and skipped", markup=False)
    if new:
        example = targets[new[0].name]
        ui.out(member_folder.send_line(example, new[0].name).replace(
            f"{example.name}/", f"{selected.name}-NAME/").replace(
            f"to {new[0].name} ", "to its member "), markup=False)


def _add_rows(selected: Any, impl: Any, current: Any, url: str, book: dict[str, Any],
              new: list[sharing_term.RosterRow], targets: dict[str, Path],
              removed: set[str]) -> list[str]:
    """Issue each new row's token and folder, write and push the registry; all or nothing (a
    folder made here is discarded on failure, an earlier folder of the person is kept)."""
    members: dict[str, dict[str, Any]] = book["members"]
    path = sharing_term.registry_path(selected.name)
    before = path.read_bytes() if path.exists() else None
    created: list[Path] = []
    said: list[str] = []
    try:
        for row in new:
            target = targets[row.name]
            refreshed = target.exists()
            if not refreshed:
                created.append(target)
            entry, _ = issue(selected, url, row.name, row.role, row.expires, target)
            members[row.name] = entry
            verb = "re-added" if row.name in removed else "added"
            said.append(f"{verb} {row.name} ({row.role}): {target}"
                        + (" (their earlier folder: bundle, token, env.sh replaced, other files "
                           "kept)" if refreshed else ""))
        sharing_term.apply_ends(members, sharing_term.ends_of(selected.sharing))
        sharing_term.write_book(selected.name, book)
        sharing.push_registry(selected, impl.head_access(current))
    except BaseException:
        for target in created:
            discard(target)
        if before is None:
            path.unlink(missing_ok=True)
        else:
            with contextlib.suppress(OSError):
                sharing_term.write_book(selected.name, json.loads(before))
        raise
    return said


def _skipped(row: sharing_term.RosterRow, entry: dict[str, Any], roster: str, flag: str) -> str:
    return (f"skipped {row.name}: removed {sharing_term.shown(entry.get('removed'))}; "
            f"`invoke member-add {row.name}{flag}` or `invoke member-add --roster {roster} "
            f"--readd{flag}` brings them back with a new token")


def _unchanged(row: sharing_term.RosterRow, entry: dict[str, Any], ends: str | None,
               flag: str = "") -> str:
    """`unchanged NAME`, and what the roster says otherwise (a change is member-update's); an
    expired member is named, not renewed."""
    differs = []
    if entry.get("role") != row.role:
        differs.append(f"--role {row.role}")
    if row.expires_cell and sharing_term.earliest(row.expires, ends) != entry.get("expires"):
        differs.append(f"--expires {row.expires_cell}")
    if sharing_term.expired(entry):
        line = (f"expired {row.name} (on {sharing_term.shown(entry.get('expires'))}), not "
                f"renewed: `invoke member-update {row.name} --expires DATE{flag}` renews them")
        return line + (f"; the roster's line {row.line} also differs: "
                       f"{' '.join(d for d in differs if d.startswith('--role'))}"
                       if any(d.startswith("--role") for d in differs) else "")
    line = f"unchanged {row.name} (same token)"
    if differs:
        line += (f"; the roster's line {row.line} differs: `invoke member-update {row.name} "
                 f"{' '.join(differs)}{flag}` applies it")
    return line


def member_update(provider: str | None, cluster: str | None, name: str, expires: str | None,
                  role: str | None) -> None:
    """Change a member's expiry or role; their token, and so their bundle, stay as they are."""
    selected, impl = _shared(provider, cluster, "member-update")
    if expires is None and role is None:
        raise UsageError(f"member-update {name}: nothing to change; give --expires DATE (or "
                         "never) and/or --role member|admin")
    if role is not None and role not in sharing_term.ROLES:
        raise UsageError(f"--role {role!r}: give member or admin")
    own = sharing_term.parse_expires(expires, "--expires") if expires is not None else None
    ends = sharing_term.ends_of(selected.sharing)
    with state.locked(selected.name, selected.provider, "member-update") as current:
        book = sharing_term.read_book(selected.name)
        check_member(selected, book["members"], name)
        entry = book["members"][name]
        if role is not None:
            entry["role"] = role
        if expires is not None:
            sharing_term.set_expiry(entry, own, ends)
        sharing_term.apply_ends(book["members"], ends)
        sharing_term.write_book(selected.name, book)
        if not current.empty:
            sharing.push_registry(selected, impl.head_access(current))
    until = sharing_term.shown(entry.get("expires")) or "no end"
    capped = " (sharing.ends)" if own and entry.get("expires") != own else ""
    ui.out(f"member {name!r} updated: {entry.get('role')}, access until {until}{capped}; "
           "same token, their next request sees it", markup=False)
    if expires is not None and sharing_term.in_past(entry.get("expires")):
        ui.warn(f"--expires {expires}: that is in the past; {name} is refused from now on "
                f"(`invoke member-update {name} --expires DATE{common.cluster_flag(selected)}` "
                "with a later date lets them in again)")


def member_bundles(provider: str | None, cluster: str | None, where: str | None) -> None:
    """Bring every member's folder (or bundle file) found in `where` up to the gateway's current
    address and certificate, with the same tokens: after a head came back elsewhere (autodown on
    a cloud gives it a new address), the owner sends the refreshed folders; no one re-joins with
    a new token. A file whose token is not a current member's is left alone."""
    from infra.node import gateway_state

    selected, _ = _shared(provider, cluster, "member-bundles")
    folder = Path(where) if where else Path.cwd()
    if not folder.is_dir():
        raise UsageError(f"--dir {folder}: no such folder; give the folder that holds the "
                         "members' folders (where member-add wrote them)")
    refreshed: list[str] = []
    with state.locked(selected.name, selected.provider, "member-bundles") as current:
        url = gateway_url(selected, current)
        book = sharing_term.read_book(selected.name)
        members: dict[str, dict[str, Any]] = book["members"]
        by_hash = {entry.get("token_sha256"): name for name, entry in members.items()
                   if sharing_term.is_member(entry)}
        for path in sorted(folder.glob(f"**/{member_folder.bundle_name(selected.name, '*')}")):
            with contextlib.suppress(OSError, ValueError):
                bundle = json.loads(path.read_text())
                name = by_hash.get(gateway_state.token_hash(str(bundle.get("token"))))
                if bundle.get("cluster") != selected.name or name is None:
                    continue
                fresh = sharing.bundle(selected.name, url, name, str(bundle["token"]))
                if path.parent.name == f"{selected.name}-{name}":
                    member_folder.refresh(path.parent, fresh)
                else:
                    atomic_write(path, json.dumps(fresh, indent=2), mode=0o600)
                members[name]["address"] = url
                refreshed.append(name)
        sharing_term.write_book(selected.name, book)
    missing = sorted(set(by_hash.values()) - set(refreshed))
    ui.out(f"{len(refreshed)} member bundle(s) in {folder} now name {url}: "
           f"{', '.join(sorted(refreshed)) or 'none'}; send them again (same tokens)", markup=False)
    if missing:
        ui.warn(f"no bundle found in {folder} for {', '.join(missing)}: give --dir where their "
                "folders are, or `member-remove` and `member-add` them for a new token")


def usage(cluster: str | None, as_json: bool) -> None:
    """A joined member's own usage and budget left, as their gateway records it."""
    from infra.core.sharing import member_usage, membership

    if not membership.joined(cluster):
        raise UsageError("`usage` shows a member their own usage on a cluster they joined "
                         "(`rayfleet usage --cluster NAME`); the owner sees everyone's with "
                         "`invoke members`")
    found = member_usage.fetch(str(cluster))
    if as_json:
        ui.out(json.dumps(found, indent=2), markup=False, soft_wrap=True)
        return
    for line in member_usage.lines(found):
        ui.out(line, markup=False)
    if found.get("note"):
        ui.warn(str(found["note"]))


def status_sharing(selected: Any, running: bool) -> dict[str, Any] | None:
    """The owner's `status` of a shared cluster (the library's `reporting.sharing_view`)."""
    from infra.app import reporting

    return reporting.sharing_view(selected, running)


def print_budget_status(spec_sharing: Any, found: dict[str, Any]) -> None:
    """`status`'s lines: the cluster's budget, and a warning per member at or past 80 %."""
    if found["cluster"] is not None:
        line = sharing_term.describe_cluster_budget(found["cluster"])
        if found["cluster"]["used"] >= sharing_term.WARN_AT:
            ui.warn(line)
        else:
            ui.out(line, markup=False)
    for near in found["members_near"]:
        ui.warn(sharing_term.describe_member_budget(spec_sharing, near["name"], near["job_hours"],
                                                    near["cost_share_usd"]))


def print_status_sharing(selected: Any, found: dict[str, Any]) -> None:
    from infra.core.sharing import term_people

    ui.out(f"gateway: {found['gateway_url'] or 'not running; `invoke up` starts it'}",
           markup=False)
    if not found["members"]:
        ui.out(f"members: none yet; `invoke member-add NAME{common.cluster_flag(selected)}`",
               markup=False)
        return
    for line in term_people.table_lines(found["members"], selected.sharing):
        ui.out(line, markup=False, soft_wrap=True)

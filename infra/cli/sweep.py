"""`invoke sweep`: paid resources that carry a rayfleet cluster id but belong to no state file here.

A crashed or lost checkout (deleted `.rayfleet/`, a laptop that died mid-`up`) leaves instances
that bill by the hour and that no `teardown` will ever find. Every resource rayfleet creates carries
its cluster's id and its owner's mark (`infra/node/identity.py`), so the sweep can tell:

- **yours, leaked**: the owner mark is this user's (this machine's `identity.owner_mark()` or one
  recorded in a state file here) and the cluster id is in no state file here;
- **a colleague's**: another owner mark. Listed only with `--all-owners`, deleted only when named
  with `--only`;
- resources without a cluster id are not rayfleet's and are never listed.

Each provider's part is its `Sweeper` (infra/providers/base.py); providers this machine has no
credentials for are skipped without a request. Shared code never branches on a provider's name.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra import providers
from infra.core import paths, ui
from infra.core.errors import RayfleetError, UsageError
from infra.node import identity

if TYPE_CHECKING:
    from infra.providers.base import Marked, Sweeper


class SweepError(RayfleetError):
    """A provider could not delete what the sweep asked for."""


@dataclass
class Found:
    item: Marked
    mine: bool


def _known() -> tuple[set[str], set[str]]:
    """Cluster ids with a state file here, and the owner marks that count as this user's."""
    from infra.core.state import State

    ids, owners = set(), {identity.owner_mark()}
    for path in paths.state_dir().glob("*.json"):
        try:
            current = State.load(path)
        except RayfleetError:
            continue
        if current is not None:
            ids.add(current.cluster_id)
            owners.add(current.owner)
    return ids, owners


def _ask(sweeper: Sweeper, result: dict[str, Any]) -> None:
    try:
        result["items"] = sweeper.marked()
    except Exception as exc:  # one provider's failure is one warning, never a traceback
        message = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        result["error"] = message


def find(all_owners: bool) -> tuple[list[Found], dict[str, Sweeper], list[str]]:
    """Leaked resources (and colleagues' with `all_owners`), every provider asked at once."""
    ids, owners = _known()
    sweepers: dict[str, Sweeper] = {}
    checks = []
    notes: list[str] = []
    for name in providers.names():
        sweeper = providers.sweeper(name)
        if sweeper is None:
            continue
        source = sweeper.credentials()
        if source is None:
            notes.append(f"{name}: no credentials on this machine; not swept")
            continue
        sweepers[name] = sweeper
        result: dict[str, Any] = {}
        thread = threading.Thread(target=_ask, args=(sweeper, result), daemon=True,
                                  name=f"sweep-{name}")
        thread.start()
        checks.append((name, sweeper, thread, result))
    started = time.monotonic()
    found: list[Found] = []
    for name, sweeper, thread, result in checks:
        thread.join(max(0.0, sweeper.timeout_s - (time.monotonic() - started)))
        if thread.is_alive():
            notes.append(f"{name}: no answer within {sweeper.timeout_s:g}s; not swept")
            continue
        if "error" in result:
            notes.append(f"{name}: not swept: {result['error']}")
            continue
        for item in result["items"]:
            if not identity.is_cluster_id(item.cluster_id) or item.cluster_id in ids:
                continue
            mine = item.owner in owners
            if mine or all_owners:
                found.append(Found(item, mine))
    return found, sweepers, notes


def run(delete: bool, yes: bool, all_owners: bool, only: list[str], as_json: bool) -> int:
    found, sweepers, notes = find(all_owners or bool(only))
    named = set(only)
    unknown = named - {f.item.id for f in found} - {f.item.name for f in found}
    if unknown:
        raise UsageError(f"--only {', '.join(sorted(unknown))}: no such leaked resource in the "
                         "list (name or id as listed; add --all-owners for colleagues')")
    if only and not all_owners:
        found = [f for f in found if f.mine or f.item.id in named or f.item.name in named]
    targets = [f for f in found if (f.item.id in named or f.item.name in named)
               or (f.mine and not named)] if delete else []
    if as_json:
        ui.out(json.dumps({
            "resources": [{**f.item.__dict__, "yours": f.mine} for f in found],
            "delete": [f.item.id for f in targets], "notes": notes,
        }, indent=2, default=str), soft_wrap=True, markup=False)
    elif not sweepers:
        ui.out("nothing swept: this machine has credentials for no provider that can be swept",
               markup=False)
    else:
        _print(found)
    for note in notes:
        ui.warn(note)
    if not delete:
        if any(f.mine for f in found):
            ui.info("`invoke sweep --delete` removes yours (listed as `yours`)")
        return 0
    if not targets:
        ui.info("nothing to delete")
        return 0
    listed = ", ".join(f"{f.item.name or f.item.id} ({f.item.provider})" for f in targets)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"--delete would remove {listed}; add --yes to confirm without a "
                             "terminal")
        answer = input(f"delete {len(targets)} resource(s): {listed}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            ui.info("nothing deleted")
            return 1
    failures = []
    for provider in sorted({f.item.provider for f in targets}):
        items = [f.item for f in targets if f.item.provider == provider]
        with ui.step(f"{provider}: deleting {len(items)} resource(s)"):
            try:
                sweepers[provider].delete(items)
            except RayfleetError as exc:
                failures.append(f"{provider}: {exc}")
    if failures:
        raise SweepError("; ".join(failures))
    ui.out(f"deleted {len(targets)} resource(s): {listed}", markup=False)
    return 0


def _print(found: list[Found]) -> None:
    if not found:
        ui.out("no leaked resources: everything carrying a rayfleet cluster id belongs to a state "
               "file here")
        return
    from rich.table import Table

    from infra.core.costs import usd

    table = Table(title="resources with a rayfleet cluster id and no state file here")
    for column in ("provider", "kind", "name", "id", "cluster", "owner", "status", "where", "$/h"):
        table.add_column(column)
    for f in found:
        item = f.item
        table.add_row(item.provider, item.kind, item.name, item.id,
                      f"{item.cluster_name or '?'} ({item.cluster_id})",
                      "yours" if f.mine else f"other ({item.owner or 'no mark'})", item.status,
                      item.where, usd(item.hourly_usd))
    ui.out(table)
    hourly = sum(f.item.hourly_usd or 0.0 for f in found if f.mine)
    ui.out(f"yours: {sum(f.mine for f in found)} resource(s), {usd(hourly)}/h", markup=False)

"""The members file's `removed` section as the gateway reads it: never a way in, only words.

`member-remove` (infra/core/sharing/term.py `remove`) moves an entry from `members` to `removed`
with its token's hash renamed `revoked_sha256`: the gateway accepts tokens from `members` only, so
a removed token is refused as before, but the refusal can now say whose it was and since when.
An entry removed with `--stop-jobs` carries `stop_jobs`: the gateway stops every job of theirs
still running and records why (gateway_removals.py). The same name's removed entries are that
person's earlier entries: a budget is per person per term (Usage.spent over `person_ids`).
Standard library only (node rule).
"""

from __future__ import annotations

import datetime as dt
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from infra.node import gateway_files as gf


def shown(instant: str | None) -> str:
    """A stored instant as a person reads it: `2026-11-27 23:59 UTC`. The end of a day the owner
    gave as a date is stored as the next midnight; it reads as that day's last minute (as
    infra/core/sharing/term.py `shown`, which node code may not import)."""
    if not instant:
        return "never"
    try:
        value = dt.datetime.fromisoformat(instant)
    except ValueError:
        return instant
    value = (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).astimezone(
        dt.timezone.utc)
    if value.time() == dt.time():
        value -= dt.timedelta(minutes=1)
    return value.strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True)
class Removed:
    name: str
    id: str
    #: When, ISO 8601 as the registry stores it.
    removed: str
    #: `member-remove --stop-jobs`: every job of theirs is stopped, with the reason recorded.
    stop_jobs: bool = False


def refusal(gone: Removed) -> str:
    return (f"member {gone.name} was removed from this cluster on {shown(gone.removed)}; ask "
            "the cluster's owner")


class Gone:
    """The `removed` section as last read (Members re-reads it with the file)."""

    def __init__(self) -> None:
        self.entries: list[Removed] = []
        self._by_hash: dict[str, Removed] = {}

    def read(self, section: list[gf.RemovedEntry], legacy_id: Callable[[str], str]) -> None:
        found = [(e, e.name) for e in section if isinstance(e.name, str)]
        self.entries = [Removed(name, str(e.id or legacy_id(name)), str(e.removed or ""),
                                bool(e.stop_jobs))
                        for e, name in found]
        self._by_hash = {str(e.revoked_sha256): gone
                         for (e, _), gone in zip(found, self.entries, strict=True)
                         if e.revoked_sha256}

    def by_digest(self, digest: str) -> Removed | None:
        """The removed entry whose token has this SHA-256 (compared in constant time)."""
        found = None
        for known, gone in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                found = gone
        return found

    def by_id(self, member_id: str | None) -> Removed | None:
        return next((gone for gone in self.entries if gone.id == member_id), None)

    def earlier_ids(self, name: str, current_id: str) -> list[str]:
        """The ids of `name`'s removed entries (the same person before a re-add)."""
        return [gone.id for gone in self.entries if gone.name == name and gone.id != current_id]

"""What changed in a running cluster's spec since its last `up`, and whether `up` applies it.

After every successful `up` the spec it put in effect is kept beside the applied files
(`.rayfleet/applied/<cluster>.spec.json`; not among them: those are `plan`'s diff). `plan` lists
each field that differs now, and `up` on a running cluster applies what its provider can change
in place (`Capabilities.applied_by_up`: a head daemon's config, say) and says, one line per field,
what needs a new cluster instead. What was not applied stays in the kept spec as it was, so the
change is still shown until it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.core import paths
from infra.core.spec import ClusterSpec
from infra.node.files import atomic_write

#: Not settings of the cluster: where the spec was read from.
IGNORED = frozenset({"source"})


@dataclass(frozen=True)
class Change:
    field: str
    before: Any
    after: Any
    #: True when `up` applies it to the running cluster.
    applied: bool

    def describe(self) -> str:
        show = json.dumps
        then = "up applies it" if self.applied else "needs a new cluster: `invoke teardown`, then `invoke up`"
        return f"{self.field}: {show(self.before)} -> {show(self.after)} ({then})"


def snapshot(selected: ClusterSpec) -> dict[str, Any]:
    return {k: v for k, v in selected.model_dump(mode="json").items() if k not in IGNORED}


def _path(name: str) -> Path:
    return paths.applied_dir(name).parent / f"{name}.spec.json"


def read_applied(name: str) -> dict[str, Any] | None:
    try:
        found = json.loads(_path(name).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _leaves(prefix: str, before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                found += _leaves(f"{prefix}.{key}", before.get(key), after.get(key))
        return found
    return [(prefix, before, after)]


def changes(applied: dict[str, Any] | None, selected: ClusterSpec) -> list[Change]:
    """Each field of `selected` that differs from the spec in effect (none before a first `up`)."""
    if applied is None:
        return []
    now = snapshot(selected)
    in_place = type(selected).CAPABILITIES.applied_by_up
    found = []
    for key in sorted(set(applied) | set(now)):
        if key in IGNORED or applied.get(key) == now.get(key):
            continue
        found += [Change(name, before, after, key in in_place)
                  for name, before, after in _leaves(key, applied.get(key), now.get(key))]
    return found


def keep(selected: ClusterSpec, applied: dict[str, Any] | None, running_before: bool) -> None:
    """After a successful `up`: the spec now in effect. On a cluster that ran before, a field its
    provider does not apply in place keeps its old value (the change is still pending)."""
    now = snapshot(selected)
    if running_before and applied is not None:
        in_place = type(selected).CAPABILITIES.applied_by_up
        for key in set(applied) | set(now):
            if key not in in_place and key not in IGNORED:
                if key in applied:
                    now[key] = applied[key]
                else:
                    now.pop(key, None)
    atomic_write(_path(selected.name), json.dumps(now, indent=2) + "\n")


def applied_line(found: list[Change]) -> str | None:
    """`up`'s one line for the changes it put into the running cluster, None without any."""
    done = [f"{c.field} {json.dumps(c.before)} -> {json.dumps(c.after)}" for c in found
            if c.applied]
    return f"applied to the running cluster: {', '.join(done)}" if done else None

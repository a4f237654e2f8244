"""What a Slurm cluster costs: node-hours, from what squeue reports (Slurm bills no money here).

A site's accounting charges node- or core-hours against an allocation; rayfleet reports node-hours
used so far by the jobs running now (nodes x elapsed), which is what a user can compare with their
allocation. Pure functions on squeue's own formats, so they run wherever squeue's output is.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.core.costs import Cost

SOURCE = "node-hours from squeue (Slurm bills no money)"


def elapsed_seconds(text: str) -> float | None:
    """squeue's %M/%l: [D-]HH:MM:SS, MM:SS or SS; None for INVALID/UNLIMITED/NOT_SET."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(?:(\d+):)?(\d+)", text.strip())
    if not match:
        return None
    days, a, b, seconds = match.groups()
    # Without a day part, two fields are MM:SS and three are HH:MM:SS.
    hours, minutes = (a, b) if b is not None else (None, a)
    return (int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60
            + int(seconds))


def count_nodes(nodelist: str) -> int:
    """Hosts in a Slurm hostlist such as "n[1-3,7],gpu01" (0 for an empty or "(null)" list)."""
    text = nodelist.strip()
    if not text or text.startswith("("):
        return 0
    total = 0
    for match in re.finditer(r"[^,\[]+(?:\[([^\]]*)\])?[^,]*", text):
        ranges = match.group(1)
        if ranges is None:
            total += 1
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            total += int(high) - int(low) + 1 if high else 1
    return total


def cost(rows: list[tuple[str, str, str]]) -> Cost:
    """Node-hours so far of (state, nodelist, elapsed) rows of the cluster's jobs."""
    from infra.core.costs import Cost

    nodes, node_hours, uptime = 0, 0.0, 0.0
    for state, nodelist, elapsed in rows:
        if state != "RUNNING":
            continue
        count = count_nodes(nodelist)
        seconds = elapsed_seconds(elapsed) or 0.0
        nodes += count
        node_hours += count * seconds / 3600
        uptime = max(uptime, seconds)
    return Cost(nodes, None, uptime if nodes else None, None, round(node_hours, 3), SOURCE)

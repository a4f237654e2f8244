"""Zone fallback for `min_workers`: with `zones:`, a new cluster's `up` waits until the head's
autoscaler has created every type's `min_workers`, and treats a stockout it logs as the zone's
refusal (provider.up then removes what the zone left and tries the next one).

`ray up` returns once the head runs; min_workers are the autoscaler's job on the head, and Google's
refusal (`ZONE_RESOURCE_POOL_EXHAUSTED` for VMs, "no more capacity" in a TPU create operation)
reaches only the head's monitor log. So this reads that log over SSH while it waits. A wait that
times out without a stockout is only a warning: the autoscaler keeps trying in the chosen zone.
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import TYPE_CHECKING

from infra.core import privilege, ui
from infra.core.errors import RayfleetError
from infra.node import wait
from infra.node.gcp_tpu.api import Gcp, GcpError
from infra.providers.gcp_tpu.launcher import CAPACITY_REASON

if TYPE_CHECKING:
    from infra.core.head import HeadAccess
    from infra.providers.gcp_tpu.spec import Spec

#: What the head's autoscaler logs when Google has no capacity (Compute and TPU wordings).
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources|no more capacity"
#: Ray's monitor runs as the autoscaler's user, with its logs in that user's 0700 home (users.py).
MONITOR_LOGS = privilege.MONITOR_LOGS


def stockout_line(head: HeadAccess) -> str:
    """The last stockout the head's autoscaler logged, or "" (also when the head cannot say)."""
    try:
        grep = f"grep -hE '{STOCKOUT}' {MONITOR_LOGS} 2>/dev/null; true"
        found = head.run(f"{privilege.AS_ROOT}sh -c {shlex.quote(grep)} | tail -n 1", timeout=30)
    except RayfleetError:
        return ""
    return " ".join(found.stdout.split())[:240]


def wait_min_workers(api: Gcp, spec: Spec, zone: str, labels: dict[str, str],
                     head: HeadAccess) -> None:
    """Wait for every type's min_workers in `zone`; GcpError (capacity) on a logged stockout."""
    wanted = {name: t.min_workers for name, t in [*spec.cpu_workers.items(),
                                                  *spec.tpu_workers.items()] if t.min_workers}
    if not wanted:
        return

    def check(step: ui.Step) -> bool | None:
        have: Counter[str] = Counter()
        for vm in api.instances(zone, labels):
            vm_labels = vm.get("labels") or {}
            if vm.get("status") == "RUNNING" and "tpu_cores" not in vm_labels:
                have[str(vm_labels.get("ray-user-node-type"))] += 1
        for node in api.tpu_nodes(zone, labels):
            if node.get("state") == "READY":
                have[str((node.get("labels") or {}).get("ray-user-node-type"))] += 1
        missing = {t: n - have[t] for t, n in wanted.items() if have[t] < n}
        if not missing:
            return True
        refused = stockout_line(head)
        if refused:
            raise GcpError(f"gcp-tpu: the autoscaler could not create min_workers in {zone} "
                           f"({refused})", reason=CAPACITY_REASON)
        step.detail("waiting for " + ", ".join(f"{n} × {t}" for t, n in sorted(missing.items())))
        return None

    try:
        ui.wait_for(check, f"min_workers in {zone} ({', '.join(sorted(wanted))})",
                    timeout=spec.ready_timeout_s, interval=3)
    except wait.WaitTimeout:
        ui.warn(f"min_workers are not all up in {zone} after {spec.ready_timeout_s} s and no "
                "stockout was logged; the autoscaler keeps trying there (`invoke status`)")

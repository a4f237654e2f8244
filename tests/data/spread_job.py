"""N one-CPU tasks on N different nodes (a STRICT_SPREAD placement group), each holding its CPU
for HOLD seconds. Usage: python spread_job.py N [HOLD]

More bundles than the cluster has nodes is demand Ray's autoscaler answers with workers. The last
line is `RESULT {"hosts": [...], "demand_at": t0, "ready_at": t1}` (the hostnames the tasks ran
on; when the group was asked for and when it was placed), which tests and benches read.
"""

from __future__ import annotations

import json
import socket
import sys
import time

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote(num_cpus=1)
def where(hold: float) -> str:
    time.sleep(hold)
    return socket.gethostname()


def main() -> None:
    count = int(sys.argv[1])
    hold = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    ray.init()
    demand_at = time.time()
    group = placement_group([{"CPU": 1}] * count, strategy="STRICT_SPREAD")
    ray.get(group.ready())
    ready_at = time.time()
    print(f"placement group of {count} ready after {ready_at - demand_at:.1f}s", flush=True)
    hosts = ray.get([
        where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote(hold)
        for i in range(count)])
    print("RESULT " + json.dumps({"hosts": sorted(hosts), "demand_at": demand_at,
                                  "ready_at": ready_at}), flush=True)


if __name__ == "__main__":
    main()

"""A job that needs N workers' GPUs at once (a STRICT_SPREAD placement group of N one-GPU bundles):
on an autoscaling cluster with no worker, the autoscaler must launch N workers for it.
Prints `RESULT {"hosts": [...]}` with the hostname each bundle ran on."""

import json
import socket
import sys

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

count = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ray.init()
group = placement_group([{"GPU": 1}] * count, strategy="STRICT_SPREAD")
ray.get(group.ready(), timeout=900)


@ray.remote(num_gpus=1, num_cpus=0)
def where() -> str:
    return socket.gethostname()


hosts = ray.get([where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
                 for i in range(count)])
print("RESULT " + json.dumps({"hosts": hosts}), flush=True)

"""A job that needs N workers' GPUs at once (a STRICT_SPREAD placement group of N one-GPU bundles):
on an autoscaling cluster with no worker, the autoscaler must launch N workers for it.
Prints `RESULT {"hosts": [...], "tracking": [...]}`: the hostname each bundle ran on, and the
MLflow tracking URI its task found in its environment with whether a password came with it."""

import json
import os
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
def where() -> tuple[str, str | None, bool]:
    return (socket.gethostname(), os.environ.get("MLFLOW_TRACKING_URI"),
            bool(os.environ.get("MLFLOW_TRACKING_PASSWORD")))


found = ray.get([where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
                 for i in range(count)])
print("RESULT " + json.dumps({"hosts": [host for host, _, _ in found],
                              "tracking": [[uri, password] for _, uri, password in found]}),
      flush=True)

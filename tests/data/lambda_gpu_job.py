"""A job that needs N workers' GPUs at once (a STRICT_SPREAD placement group of N one-GPU bundles):
on an autoscaling cluster with no worker, the autoscaler must launch N workers for it.
Prints `RESULT {"hosts": [...], "tracking": [...]}`: the hostname each bundle ran on, and the
MLflow tracking URI its task found in its environment with whether a password came with it.
With a second argument (a path on the head), it then holds the workers' GPUs until that file
exists: a test looks at the scaled cluster while the job still needs it, then releases it."""

import json
import os
import socket
import sys
import time

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

count = int(sys.argv[1]) if len(sys.argv) > 1 else 2
release = sys.argv[2] if len(sys.argv) > 2 else None
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
if release:
    # The placement group (the GPUs) stays reserved while this waits: the workers are not idle.
    deadline = time.monotonic() + 900
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            sys.exit(f"nobody created {release} within 900 s")
        time.sleep(0.2)
    print("released", flush=True)

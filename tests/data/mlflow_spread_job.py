"""One task on each of N nodes (STRICT_SPREAD), each logging an MLflow run with a metric, with
nothing in this code about where the server is or how to log in: the node's environment says so.
Usage: python mlflow_spread_job.py N

The last line is `RESULT {"hosts": [...], "runs": {hostname: run_id}}`.
"""

from __future__ import annotations

import json
import socket
import sys

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote(num_cpus=1)
def train_here() -> tuple[str, str]:
    import mlflow

    host = socket.gethostname()
    with mlflow.start_run(run_name=f"on-{host}") as run:
        mlflow.log_param("host", host)
        mlflow.log_metric("answer", 42.0)
    return host, run.info.run_id


def main() -> None:
    count = int(sys.argv[1])
    ray.init()
    group = placement_group([{"CPU": 1}] * count, strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=120)
    strategy = PlacementGroupSchedulingStrategy(placement_group=group)
    done = ray.get([train_here.options(scheduling_strategy=strategy).remote() for _ in range(count)])
    print("RESULT " + json.dumps({"hosts": [h for h, _ in done], "runs": dict(done)}), flush=True)


if __name__ == "__main__":
    main()

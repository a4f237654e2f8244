"""The job `invoke doctor` submits: every alive node reports its Python and Ray versions.

It runs on the cluster, not on this machine: one zero-CPU task pinned to each alive node (hard
NodeAffinitySchedulingStrategy, so a busy node still answers and no node is skipped), then it
prints one `RESULT {...}` line that infra/core/doctor.py reads from the job's logs. It uses only Ray
and the standard library, and nothing else from rayfleet, because only this file is uploaded.
"""

from __future__ import annotations

import json
import platform
import socket
import sys
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

#: Seconds to wait for the tasks; a node that has not answered by then is reported as such.
TIMEOUT_S = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0


def versions() -> dict[str, Any]:
    """What the Ray worker process on this node runs (the node's own Ray env)."""
    return {
        "host": socket.gethostname(),
        "python_version": platform.python_version(),
        "ray_version": ray.__version__,
        "python": sys.executable,
    }


def main() -> None:
    ray.init()
    probe = ray.remote(num_cpus=0, max_retries=0)(versions)
    nodes = [node for node in ray.nodes() if node["Alive"]]
    # This driver runs on a node already (the head, where Ray runs job drivers) and answers for
    # it itself: a task there would only wait for a worker process to start.
    here = ray.get_runtime_context().get_node_id()
    refs = {
        node["NodeID"]: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote()
        for node in nodes if node["NodeID"] != here
    }
    ready, _ = (ray.wait(list(refs.values()), num_returns=len(refs), timeout=TIMEOUT_S)
                if refs else ([], []))
    report = []
    for node in nodes:
        entry: dict[str, Any] = {
            "node_id": node["NodeID"],
            "ip": node["NodeManagerAddress"],
            "head": "node:__internal_head__" in node["Resources"],
        }
        if node["NodeID"] == here:
            entry.update(versions())
            report.append(entry)
            continue
        ref = refs[node["NodeID"]]
        if ref in ready:
            try:
                answer: dict[str, Any] = ray.get(ref)
                entry.update(answer)
            except Exception as exc:  # report, don't crash: other nodes' answers still count
                entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        else:
            ray.cancel(ref, force=True)
            entry["error"] = f"no answer within {TIMEOUT_S:g}s"
        report.append(entry)
    print("RESULT " + json.dumps({"driver": versions(), "nodes": report}), flush=True)


if __name__ == "__main__":
    main()

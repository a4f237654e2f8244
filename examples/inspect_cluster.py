"""Prints the cluster's nodes and resources as Ray sees them.

Submit it with `invoke submit examples/inspect_cluster.py`. The last line is `RESULT {...}`.
"""

from __future__ import annotations

import json

import ray


def main() -> None:
    ray.init()
    total = ray.cluster_resources()
    available = ray.available_resources()
    alive = [n for n in ray.nodes() if n["Alive"]]
    print(f"{len(alive)} alive node(s)")
    for node in alive:
        resources = {k: v for k, v in node["Resources"].items() if not k.startswith("node:")}
        print(f"  {node['NodeManagerHostname']} {node['NodeManagerAddress']}: {resources}")
    print("resource        total   available")
    for key in sorted(k for k in total if not k.startswith("node:")):
        print(f"  {key:14s} {total[key]:7g} {available.get(key, 0):9g}")
    print("RESULT " + json.dumps({"nodes": len(alive), "resources": total}))


if __name__ == "__main__":
    main()

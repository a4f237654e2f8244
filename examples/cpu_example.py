"""N parallel CPU tasks; prints where each ran. Usage: python cpu_example.py [N]

Submit it with `invoke submit examples/cpu_example.py -- 8`. The last line is a machine-readable
summary (`RESULT {...}`) that tests read.
"""

from __future__ import annotations

import argparse
import json
import socket
import time

import ray


@ray.remote(num_cpus=1)
def work(i: int) -> dict[str, object]:
    # Enough arithmetic to keep a core busy for a moment, so tasks overlap across nodes.
    started = time.time()
    total = sum(k * k for k in range(200_000))
    return {
        "task": i,
        "host": socket.gethostname(),
        "node": ray.get_runtime_context().get_node_id()[:12],
        "ip": ray.util.get_node_ip_address(),
        "seconds": round(time.time() - started, 3),
        "checksum": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("n", type=int, nargs="?", default=8, help="number of tasks (default 8)")
    args = parser.parse_args()
    ray.init()
    started = time.time()
    results = ray.get([work.remote(i) for i in range(args.n)])
    for r in results:
        print(f"task {r['task']:3d} ran on {r['host']} ({r['ip']}, node {r['node']}) "
              f"in {r['seconds']}s")
    hosts = sorted({str(r["host"]) for r in results})
    nodes = sorted({str(r["node"]) for r in results})
    print(f"{args.n} tasks on {len(nodes)} node(s) {hosts} in {time.time() - started:.2f}s")
    print("RESULT " + json.dumps({"tasks": args.n, "hosts": hosts, "nodes": nodes}))


if __name__ == "__main__":
    main()

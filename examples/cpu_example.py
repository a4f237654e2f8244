"""N parallel CPU tasks; prints where each ran. Usage: python cpu_example.py [N] [--hold S]

Submit it with `invoke submit examples/cpu_example.py -- 8`. With `--hold S` each task keeps its
CPU for at least S seconds: short tasks all run on the first node's worker while another node's
worker is still starting (Ray gives a queued task to whichever leased worker is free first), so a
demonstration of several nodes needs tasks that outlast a worker's start. The last line is a machine-readable
summary (`RESULT {...}`) that tests read.
"""

from __future__ import annotations

import argparse
import json
import socket
import time

import ray


@ray.remote(num_cpus=1)
def work(i: int, hold: float = 0.0) -> dict[str, object]:
    # Enough arithmetic to keep a core busy for a moment, so tasks overlap across nodes.
    started = time.time()
    total = sum(k * k for k in range(200_000))
    time.sleep(max(0.0, hold - (time.time() - started)))
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
    parser.add_argument("--hold", type=float, default=0.0, metavar="S",
                        help="seconds each task keeps its CPU at least (default 0)")
    args = parser.parse_args()
    ray.init()
    started = time.time()
    results = ray.get([work.remote(i, args.hold) for i in range(args.n)])
    for r in results:
        print(f"task {r['task']:3d} ran on {r['host']} ({r['ip']}, node {r['node']}) "
              f"in {r['seconds']}s")
    hosts = sorted({str(r["host"]) for r in results})
    nodes = sorted({str(r["node"]) for r in results})
    print(f"{args.n} tasks on {len(nodes)} node(s) {hosts} in {time.time() - started:.2f}s")
    print("RESULT " + json.dumps({"tasks": args.n, "hosts": hosts, "nodes": nodes}))


if __name__ == "__main__":
    main()

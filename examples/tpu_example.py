"""A matrix multiplication on TPU chips with JAX: N Ray tasks, each holding the chips of one host.

Each task asks Ray for `resources: {TPU: C}` (C = chips per host: 4 on a v4-8; the runtime env
setup/runtime/tpu.yaml sets it), so Ray places it on a TPU VM and nowhere else. There it multiplies
random matrices on every local chip at once (jax.pmap) and reports the throughput.

    invoke submit --runtime-env setup/runtime/tpu.yaml examples/tpu_example.py -- 2
    invoke submit --runtime-env setup/runtime/tpu.yaml examples/tpu_example.py -- 2 --size 8192

On a cluster without TPUs it says so and exits 0: nothing is run and nothing is pretended.
The last line is a machine-readable summary: `RESULT {...}`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

import ray


def matmul_on_local_chips(size: int, repeats: int) -> dict[str, Any]:
    """Runs on a TPU host: x @ x.T on each local TPU chip in parallel; returns what it saw."""
    host = socket.gethostname()
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {"host": host, "error": "jax is not installed here; install the node with "
                                       "`setup/install.sh --env tpu`"}
    chips = [d for d in jax.local_devices() if d.platform == "tpu"]
    if not chips:
        platforms = sorted({d.platform for d in jax.local_devices()})
        return {"host": host, "error": f"JAX sees no TPU here, only {platforms}; is libtpu "
                                       "installed (jax[tpu]) and no other process holding the chips?"}
    keys = jax.random.split(jax.random.PRNGKey(0), len(chips))
    step = jax.pmap(lambda k: (lambda x: x @ x.T)(jax.random.normal(k, (size, size), jnp.float32)))
    step(keys).block_until_ready()  # compile once, outside the timing
    started = time.perf_counter()
    for _ in range(repeats):
        out = step(keys)
    out.block_until_ready()
    seconds = time.perf_counter() - started
    flops = 2.0 * size**3 * len(chips) * repeats
    return {
        "host": host,
        "chips": len(chips),
        "device_kind": chips[0].device_kind,
        "seconds": round(seconds, 4),
        "tflops": round(flops / seconds / 1e12, 2),
        # The trace of x @ x.T is the sum of squares of x: positive, a cheap sanity check.
        "trace": float(jnp.trace(out[0])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int, nargs="?", default=1, help="number of tasks (default 1)")
    parser.add_argument("--size", type=int, default=2048, help="matrix side (default 2048)")
    parser.add_argument("--repeats", type=int, default=10, help="timed multiplications (default 10)")
    parser.add_argument("--chips", type=float,
                        default=float(os.environ.get("RAYFLEET_TPU_CHIPS_PER_HOST", "4")),
                        help="TPU chips per task, i.e. per host (default: $RAYFLEET_TPU_CHIPS_PER_HOST "
                             "or 4, a v4-8 host)")
    parser.add_argument("--full", action="store_true", help="real size: 8192x8192, 50 repeats")
    args = parser.parse_args()
    if args.full:
        args.size, args.repeats = 8192, 50

    ray.init()
    total = ray.cluster_resources().get("TPU", 0.0)
    if total < args.chips:
        reason = (f"this cluster has {total:g} TPU chips, a task needs {args.chips:g} "
                  f"(resources: {{TPU: {args.chips:g}}})")
        print(f"no TPU host to run on: {reason}. Start a cluster with TPU workers "
              "(invoke up --provider=gcp-tpu); nothing was run.")
        print("RESULT " + json.dumps({"tpu": False, "tasks": 0, "tpu_chips": total,
                                      "chips_per_task": args.chips, "reason": reason}))
        return 0

    task = ray.remote(matmul_on_local_chips).options(resources={"TPU": args.chips}, num_cpus=0)
    print(f"{args.n} task(s), {args.chips:g} chips each, {args.size}x{args.size} float32; "
          f"cluster TPU chips: {total:g}")
    results = ray.get([task.remote(args.size, args.repeats) for _ in range(args.n)])
    errors = [r for r in results if "error" in r]
    for r in results:
        if "error" in r:
            print(f"  {r['host']}: ERROR {r['error']}")
        else:
            print(f"  {r['host']}: {r['chips']} x {r['device_kind']}, {r['tflops']} TFLOP/s "
                  f"({args.repeats} multiplications in {r['seconds']}s)")
    print("RESULT " + json.dumps({"tpu": True, "tasks": args.n, "tpu_chips": total,
                                  "chips_per_task": args.chips, "results": results}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

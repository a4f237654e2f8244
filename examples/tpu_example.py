"""A matrix multiplication on TPU chips with JAX: N Ray tasks, each holding the chips of one host.

Each task asks Ray for `resources: {TPU: C}` (C = chips per host: 4 on a v4-8; the runtime env
setup/runtime/tpu.yaml sets it), so Ray places it on a TPU VM and nowhere else. There it multiplies
random matrices on every local chip at once (jax.pmap) and reports the throughput.

    invoke submit --runtime-env setup/runtime/tpu.yaml examples/tpu_example.py -- 2
    invoke submit --runtime-env setup/runtime/tpu.yaml examples/tpu_example.py -- 2 --size 8192
    invoke submit examples/tpu_example.py -- --wait-for-tpu 900 --placement-only

With TPU workers that scale from zero, `--wait-for-tpu SECONDS` submits the tasks even though no
TPU host exists yet: their demand makes the autoscaler create one. `--placement-only` checks where
the tasks land and which chips Ray gives them, without JAX (a quick test of a new cluster).

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


def placement_on_local_chips(hold_s: float) -> dict[str, Any]:
    """Runs on a TPU host: which host and which chips Ray gave this task (no JAX needed)."""
    started = time.monotonic()
    context = ray.get_runtime_context()
    chips = context.get_accelerator_ids().get("TPU", [])
    time.sleep(hold_s)  # holds the chips, e.g. so that a job is running when a spot node goes
    return {"host": socket.gethostname(), "node_id": context.get_node_id(),
            "tpu_ids": list(chips), "held_s": round(time.monotonic() - started, 2),
            "ended_at": round(time.time(), 3)}


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
    parser.add_argument("--wait-for-tpu", type=float, default=0.0, metavar="SECONDS",
                        help="when the cluster has no TPU host yet, submit anyway and wait this "
                             "long for the autoscaler to add one (default 0: say so and exit)")
    parser.add_argument("--placement-only", action="store_true",
                        help="only report each task's host and TPU ids (no JAX)")
    parser.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                        help="with --placement-only: keep the chips this long")
    args = parser.parse_args()
    if args.full:
        args.size, args.repeats = 8192, 50

    ray.init()
    total = ray.cluster_resources().get("TPU", 0.0)
    if total < args.chips and not args.wait_for_tpu:
        reason = (f"this cluster has {total:g} TPU chips, a task needs {args.chips:g} "
                  f"(resources: {{TPU: {args.chips:g}}})")
        print(f"no TPU host to run on: {reason}. Start a cluster with TPU workers "
              "(invoke up --provider=gcp-tpu); nothing was run.")
        print("RESULT " + json.dumps({"tpu": False, "tasks": 0, "tpu_chips": total,
                                      "chips_per_task": args.chips, "reason": reason}))
        return 0

    if args.placement_only:
        task = ray.remote(placement_on_local_chips).options(resources={"TPU": args.chips},
                                                             num_cpus=0)
        refs = [task.remote(args.hold) for _ in range(args.n)]
    else:
        task = ray.remote(matmul_on_local_chips).options(resources={"TPU": args.chips}, num_cpus=0)
        refs = [task.remote(args.size, args.repeats) for _ in range(args.n)]
    print(f"{args.n} task(s), {args.chips:g} chips each; cluster TPU chips: {total:g}"
          + ("" if total >= args.chips else f", waiting up to {args.wait_for_tpu:g} s for the "
                                             "autoscaler to add a TPU host"), flush=True)
    ready, _ = ray.wait(refs, num_returns=len(refs),
                        timeout=None if total >= args.chips else args.wait_for_tpu)
    if len(ready) < len(refs):
        for ref in refs:
            ray.cancel(ref, force=True)
        print(f"no TPU host appeared within {args.wait_for_tpu:g} s; see `invoke status` for "
              "the autoscaler's view (quota, capacity, or no TPU worker type)")
        print("RESULT " + json.dumps({"tpu": False, "tasks": 0, "tpu_chips": total,
                                      "chips_per_task": args.chips, "reason": "timeout"}))
        return 1
    results = ray.get(refs)
    errors = [r for r in results if "error" in r]
    for r in results:
        if args.placement_only:
            print(f"  {r['host']}: TPU ids {r['tpu_ids']} (held {r['held_s']} s)")
        elif "error" in r:
            print(f"  {r['host']}: ERROR {r['error']}")
        else:
            print(f"  {r['host']}: {r['chips']} x {r['device_kind']}, {r['tflops']} TFLOP/s "
                  f"({args.repeats} multiplications in {r['seconds']}s)")
    print("RESULT " + json.dumps({"tpu": True, "tasks": args.n, "tpu_chips": total,
                                  "chips_per_task": args.chips, "results": results}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""The CPU-bound job bench/metrics.py times: N Ray tasks of a fixed amount of arithmetic each,
timed inside the driver from the first submission to the last result (`WORK <seconds>`).
Usage (as a Ray job): python bench/cpu_job.py N ITERATIONS"""

import sys
import time

import ray


@ray.remote(num_cpus=1)
def work(iterations: int) -> int:
    total = 0
    for k in range(iterations):
        total += k * k % 7
    return total


ray.init()
ray.get([work.remote(1000) for _ in range(int(sys.argv[1]))])  # warm workers, not timed
started = time.perf_counter()
ray.get([work.remote(int(sys.argv[2])) for _ in range(int(sys.argv[1]))])
print(f"WORK {time.perf_counter() - started:.4f}")

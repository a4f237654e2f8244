"""Keeps N CPUs busy for S seconds, one Ray task of one CPU each (tests/local/test_e2e_metrics.py,
bench/metrics.py). Usage: python burn_cpus.py N S"""

from __future__ import annotations

import sys
import time

import ray


@ray.remote(num_cpus=1)
def burn(seconds: float) -> int:
    end, spins = time.time() + seconds, 0
    while time.time() < end:
        spins += 1
    return spins


if __name__ == "__main__":
    ray.init()
    started = time.time()
    ray.get([burn.remote(float(sys.argv[2])) for _ in range(int(sys.argv[1]))])
    print(f"BURNED {time.time() - started:.3f}")

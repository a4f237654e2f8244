"""Ray Core in one page: train M random forests sequentially, then in parallel, and compare.

Each model is a scikit-learn RandomForestRegressor with a different `n_estimators`, trained on a
generated regression problem (make_friedman1: nothing is downloaded). The data goes into Ray's
object store once with `ray.put`; every `@ray.remote` task reads the same copy.

    invoke submit --runtime-env setup/runtime/cpu.yaml examples/forest.py            # small
    invoke submit --runtime-env setup/runtime/cpu.yaml examples/forest.py -- --full  # real size

The last line is a machine-readable summary: `RESULT {...}`.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import ray


def make_data(samples: int, seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import make_friedman1
    from sklearn.model_selection import train_test_split

    x, y = make_friedman1(n_samples=samples, n_features=10, noise=1.0, random_state=seed)
    return tuple(train_test_split(x, y, test_size=0.25, random_state=seed))


def fit_and_score(n_estimators: int, x_train: np.ndarray, x_test: np.ndarray, y_train: np.ndarray,
                  y_test: np.ndarray) -> dict[str, Any]:
    """Train one forest (one core, fixed seed) and return its test MSE."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.metrics import mean_squared_error

    started = time.perf_counter()
    model = RandomForestRegressor(n_estimators=n_estimators, random_state=0, n_jobs=1)
    model.fit(x_train, y_train)
    mse = float(mean_squared_error(y_test, model.predict(x_test)))
    return {"n_estimators": n_estimators, "mse": mse,
            "seconds": round(time.perf_counter() - started, 3)}


# The same function as a Ray task: one CPU each, so the scheduler runs as many at once as the
# cluster has cores, across all nodes.
fit_and_score_remote = ray.remote(num_cpus=1)(fit_and_score)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4, help="number of forests M (default 4)")
    parser.add_argument("--samples", type=int, default=3000, help="rows of data (default 3000)")
    parser.add_argument("--step", type=int, default=25,
                        help="model i gets step*(i+1) trees (default 25)")
    parser.add_argument("--full", action="store_true",
                        help="real size: 8 models, 20000 rows, 50*(i+1) trees")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.full:
        args.models, args.samples, args.step = 8, 20000, 50
    estimators = [args.step * (i + 1) for i in range(args.models)]

    ray.init()
    data = make_data(args.samples, args.seed)
    print(f"{args.models} forests with {estimators} trees on {args.samples} rows; "
          f"cluster CPUs: {ray.cluster_resources().get('CPU', 0):g}")

    started = time.perf_counter()
    sequential = [fit_and_score(n, *data) for n in estimators]
    sequential_s = time.perf_counter() - started
    print(f"sequential: {sequential_s:.2f}s")

    started = time.perf_counter()
    refs = [ray.put(part) for part in data]  # one copy in the object store, shared by all tasks
    parallel = ray.get([fit_and_score_remote.remote(n, *refs) for n in estimators])
    parallel_s = time.perf_counter() - started
    print(f"parallel:   {parallel_s:.2f}s (speed-up {sequential_s / parallel_s:.2f}x)")

    for result in parallel:
        print(f"  n_estimators={result['n_estimators']:4d}  MSE {result['mse']:.4f}  "
              f"({result['seconds']}s)")
    best = min(parallel, key=lambda r: r["mse"])
    print(f"best: n_estimators={best['n_estimators']} with MSE {best['mse']:.4f}")
    print("RESULT " + json.dumps({
        "models": args.models,
        "samples": args.samples,
        "sequential_s": round(sequential_s, 3),
        "parallel_s": round(parallel_s, 3),
        "speedup": round(sequential_s / parallel_s, 3),
        "best": {"n_estimators": best["n_estimators"], "mse": best["mse"]},
        "mse_sequential": [r["mse"] for r in sequential],
        "mse_parallel": [r["mse"] for r in parallel],
    }))


if __name__ == "__main__":
    main()

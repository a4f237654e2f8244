"""`invoke up` (local) with `tracking: mlflow` next to the same spec without it.

Both are timed until `up` returns (the dashboard accepts jobs); `up` does not wait for the tracking
server, whose own time to answer is printed beside. Runs alternate; prints each pair and the median
ratio (target: <= 1.05).
Usage: python bench/tracking_up.py [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _up_down(spec: Path, env: dict[str, str], home: Path, tracking: bool) -> tuple[float, float | None]:
    import requests

    invoke = [sys.executable, "-m", "invoke"]
    started = time.monotonic()
    done = subprocess.run([*invoke, "up", "--cluster", str(spec)], cwd=ROOT, env=env,
                          check=False, capture_output=True, text=True)
    if done.returncode:
        subprocess.run([*invoke, "teardown", "--cluster", str(spec)], cwd=ROOT, env=env,
                       check=False, capture_output=True)
        raise SystemExit(f"invoke up failed: {done.stderr.strip().splitlines()[-1:]}")
    took = time.monotonic() - started
    answered = None
    if tracking:
        state = json.loads((home / "state" / f"{spec.stem}.json").read_text())
        port = int(state["resources"][0]["attrs"]["port_base"]) + 9  # PortBlock.tracking
        while time.monotonic() - started < 300:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    answered = time.monotonic() - started
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
    subprocess.run([*invoke, "teardown", "--cluster", str(spec)], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    return took, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one pair (for CI)")
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    work = Path(tempfile.mkdtemp(prefix="rf-bench-tracking-"))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAYFLEET_HOME": str(work / "home")}
    base = "provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n"
    plain = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
    plain.write_text(base)
    tracked = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
    tracked.write_text(base + "tracking: mlflow\n")
    ratios = []
    try:
        for rep in range(reps):
            without, _ = _up_down(plain, env, work / "home", False)
            with_tracking, answered = _up_down(tracked, env, work / "home", True)
            ratios.append(with_tracking / without)
            server = (f"tracking server answered after {answered:.1f}s" if answered
                      else "tracking server did not answer")
            print(f"rep {rep + 1}: up {without:.2f}s   up with tracking {with_tracking:.2f}s   "
                  f"ratio {with_tracking / without:.3f}   ({server})", flush=True)
        print(f"median ratio up with tracking / without: {statistics.median(ratios):.3f} "
              f"(target <= 1.05, {reps} reps)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Time-to-ready of `invoke up` (local) next to a raw `ray start --head` with the same flags.

Both are measured until the dashboard accepts jobs (GET /api/jobs/ answers 200), in the same run,
alternating, several repetitions; prints each pair and the median ratio (target: <= 1.05). The
raw start runs the very command line `up` ran; a third start runs it with Ray's own `ray` script
in place of raycli's lean load of Ray's CLI (infra/node/raycli.py), as a user would type it.
The raw baseline uses a copy of the cluster's token, because `teardown` deletes the original.
Usage: python bench/local_up.py [--reps 5] [--quick]   (--quick: one repetition, for CI)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.core import jobs  # noqa: E402
from infra.node import raycli, rayproc, where  # noqa: E402


def _ready(url: str, token: Path) -> None:
    # The same check `invoke up` makes: token auth answers 401 to a request without the token.
    while not jobs.dashboard_ready(url, token):
        time.sleep(0.05)


def _byte_compiled() -> None:
    """rayfleet's modules byte-compiled, as a user's are: pip compiles an installed package, and
    a checkout's first run writes them. Where PYTHONDONTWRITEBYTECODE is set (some CI and agent
    shells) every `invoke up` would compile its ~60 modules again (~60 ms on this bench's 2-core
    machine), while the raw `ray start` runs Ray's modules compiled at install."""
    import compileall

    compileall.compile_dir(ROOT / "infra", quiet=1)
    compileall.compile_file(ROOT / "tasks.py", quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one repetition (CI keeps it running)")
    args = parser.parse_args()
    if args.quick:
        args.reps = 1
    _byte_compiled()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    work = Path(tempfile.mkdtemp(prefix="rf-bench-"))
    env["RAYFLEET_HOME"] = str(work / "home")
    name = f"bench{uuid.uuid4().hex[:6]}"
    spec = work / f"{name}.yaml"
    spec.write_text("provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n")
    ratios: list[float] = []
    stock_ratios: list[float] = []
    ray = where.ray_executable()
    lean = " ".join(shlex.quote(word) for word in raycli.argv_here(ray))
    for rep in range(args.reps):
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "invoke", "up", "--cluster", str(spec)], cwd=ROOT,
                       env=env, check=True, capture_output=True)
        ours = time.monotonic() - started
        state = json.loads((work / "home" / "state" / f"{name}.json").read_text())
        script = (work / "home" / "rendered" / name / "start.sh").read_text()
        assert lean in script, "the start script no longer starts Ray through raycli"
        # `teardown` deletes the cluster's token; the baseline's `ray start` reads a copy instead.
        token = work / "ray-token"
        shutil.copy2(state["info"]["auth_token_path"], token)
        script = script.replace(state["info"]["auth_token_path"], str(token))
        head = next(r for r in state["resources"] if r["attrs"].get("port_base"))
        subprocess.run([sys.executable, "-m", "invoke", "teardown", "--cluster", str(spec)],
                       cwd=ROOT, env=env, check=True, capture_output=True)

        # The raw baseline: the very same `ray start` command line, then the same readiness check.
        raw = _raw_start(script, head, state["info"]["dashboard_url"], token, env)
        # And as a user types it: Ray's own `ray` script in place of raycli's lean load of it.
        stock = _raw_start(script.replace(lean, shlex.quote(ray), 1), head,
                           state["info"]["dashboard_url"], token, env)
        ratios.append(ours / raw)
        stock_ratios.append(ours / stock)
        print(f"rep {rep + 1}: invoke up {ours:.2f}s   raw ray start {raw:.2f}s   "
              f"ratio {ours / raw:.3f}   stock `ray start` {stock:.2f}s   ratio "
              f"{ours / stock:.3f}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(f"median ratio invoke up / raw ray start: {statistics.median(ratios):.3f} "
          f"(the same command line; target <= 1.05, {args.reps} reps)")
    print(f"median ratio invoke up / stock `ray start` (Ray's `ray` script, same flags): "
          f"{statistics.median(stock_ratios):.3f}")


def _raw_start(script: str, head: dict[str, Any], url: str, token: Path,
               env: dict[str, str]) -> float:
    """Seconds from running the start script by hand until the dashboard accepts jobs; the
    Ray it started is then stopped again (only its processes name its temp dir and port)."""
    # The script takes its temp dir as `up` gives it (the head's id, inside a private parent).
    Path(head["id"]).parent.mkdir(mode=0o700, exist_ok=True)
    started = time.monotonic()
    subprocess.run(["bash", "-c", script, "start.sh", head["id"]], env=env, check=True,
                   capture_output=True)
    _ready(url, token)
    took = time.monotonic() - started
    gcs = rayproc.gcs_marker(int(head["attrs"]["port_base"]))
    rayproc.terminate(rayproc.cluster_processes([head["id"], gcs]))
    shutil.rmtree(Path(head["id"]).parent, ignore_errors=True)
    return took


if __name__ == "__main__":
    main()

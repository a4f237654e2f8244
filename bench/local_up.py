"""Time-to-ready of `invoke up` (local) next to a raw `ray start --head` with the same flags.

Both are measured until the dashboard accepts jobs (GET /api/jobs/ answers 200), in the same run,
alternating, several repetitions; prints each pair and the median ratio (target: <= 1.05). The
raw start runs the very command line `up` ran; a third start runs it with Ray's own `ray` script
in place of raycli's lean load of Ray's CLI (infra/node/raycli.py), as a user would type it.
The raw baseline uses a copy of the cluster's token, because `teardown` deletes the original.
Usage: python bench/local_up.py [--reps 5] [--quick]   (--quick: one repetition, for CI)
"""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from infra.core import jobs, paths  # noqa: E402
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


def measure(spec: Path, env: dict[str, str], ours: float, label: str = "rep 1",
            stock: bool = True) -> tuple[float, float | None]:
    """After `invoke up` of the running local cluster `spec` took `ours` seconds: tear it down,
    run its very start script by hand, then (with `stock`) with Ray's own `ray` script; (ratio to
    the raw start, ratio to the stock start or None), printed. CI calls this in
    tests/test_examples.py on the plain cluster it starts beside its own (tracking_up's arm
    without tracking: an `up` of this bench's own would repeat it), without the stock start: the
    target is the raw start's ratio, and a third Ray head would only add its ~10 CPU-s."""
    home = Path(env["RAYFLEET_HOME"])
    state = json.loads((home / "state" / f"{spec.stem}.json").read_text())
    script = (home / "rendered" / spec.stem / "start.sh").read_text()
    # `up` starts Ray through setup/users/ray.sh as the caller, which loads raycli's lean CLI.
    through = f"bash {shlex.quote(str(paths.setup_dir() / 'users' / 'ray.sh'))} -u -"
    assert through in script, "the start script no longer starts Ray through setup/users/ray.sh"
    lean = " ".join(shlex.quote(word) for word in raycli.argv_here(where.ray_executable()))
    # `teardown` deletes the cluster's token; the baseline's `ray start` reads a copy instead.
    token = home.parent / f"{spec.stem}-ray-token"
    shutil.copy2(state["info"]["auth_token_path"], token)
    script = script.replace(state["info"]["auth_token_path"], str(token))
    head = next(r for r in state["resources"] if r["attrs"].get("port_base"))
    common.invoke(["teardown", "--cluster", str(spec)], env)
    # The raw baseline: the same `ray start` (raycli's lean load, as ray.sh runs it) with the same
    # flags and environment, then the same readiness check.
    raw = _raw_start(script.replace(through, lean, 1), head, state["info"]["dashboard_url"], token,
                     env)
    # And as a user types it: Ray's own `ray` script in place of raycli's lean load of it.
    typed = _raw_start(script.replace(through, shlex.quote(where.ray_executable()), 1), head,
                       state["info"]["dashboard_url"], token, env) if stock else None
    token.unlink()
    shown = f"   stock `ray start` {typed:.2f}s   ratio {ours / typed:.3f}" if typed is not None else ""
    print(f"{label}: invoke up {ours:.2f}s   raw ray start {raw:.2f}s   ratio {ours / raw:.3f}"
          f"{shown}", flush=True)
    return ours / raw, (ours / typed if typed is not None else None)


def summary(ratios: list[tuple[float, float | None]]) -> None:
    print(f"median ratio invoke up / raw ray start: "
          f"{statistics.median(raw for raw, _ in ratios):.3f} "
          f"(the same command line; target <= 1.05, {len(ratios)} reps)")
    stocks = [stock for _, stock in ratios if stock is not None]
    if stocks:
        print(f"median ratio invoke up / stock `ray start` (Ray's `ray` script, same flags): "
              f"{statistics.median(stocks):.3f}")


def main() -> None:
    args = common.options(__doc__, 5, quick="one repetition (CI keeps it running)")
    _byte_compiled()
    ratios: list[tuple[float, float | None]] = []
    with common.workdir("rf-bench-") as (env, work):
        spec = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
        spec.write_text(common.LOCAL_SPEC)
        for rep in range(args.reps):
            started = time.monotonic()
            common.invoke(["up", "--cluster", str(spec)], env)
            ratios.append(measure(spec, env, time.monotonic() - started, f"rep {rep + 1}"))
    summary(ratios)


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

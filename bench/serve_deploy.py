"""Time from `invoke serve-deploy` to the first answered request, next to Ray's own `serve deploy`.

Same local cluster, same app (bench/serve_echo.py), same working-dir package and HTTP port; Serve is
shut down (DELETE /api/serve/applications/) before each deploy, so both start from nothing. Runs
alternate; prints each pair and the median ratio (target: <= 1.10).
Usage: python bench/serve_deploy.py [--reps 3] [--quick]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402


def _answered(url: str, timeout: float = 300) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise SystemExit(f"no answer from {url} within {timeout}s")


def _shutdown(dashboard: str, headers: dict[str, str]) -> None:
    import requests

    requests.delete(f"{dashboard}/api/serve/applications/", headers=headers, timeout=120)
    while requests.get(f"{dashboard}/api/serve/applications/", headers=headers,
                       timeout=30).json().get("applications"):
        time.sleep(0.2)


def measure(spec: Path, env: dict[str, str], reps: int, work: Path) -> list[float]:
    """`reps` pairs on the running local cluster `spec` (its state under env's RAYFLEET_HOME),
    Serve shut down after each deploy; each pair's ratio, printed with the median. `work`: a
    folder for Ray's config file. CI calls this on tests/test_examples.py's cluster (an `up` of
    its own would only repeat that module's)."""
    import requests

    state = json.loads((Path(env["RAYFLEET_HOME"]) / "state" / f"{spec.stem}.json").read_text())
    dashboard = state["info"]["dashboard_url"]
    token_path = state["info"]["auth_token_path"]
    headers = {"Authorization": f"Bearer {Path(token_path).read_text().strip()}"}
    invoke = [sys.executable, "-m", "invoke"]
    ratios = []
    for rep in range(reps):
        started = time.monotonic()
        done = subprocess.run([*invoke, "serve-deploy", "--cluster", str(spec),
                               "bench.serve_echo:app"], cwd=ROOT, env=env, check=True,
                              capture_output=True, text=True)
        url = done.stdout.strip().splitlines()[-1]
        _answered(url)
        ours = time.monotonic() - started
        deployed: dict[str, Any] = requests.get(f"{dashboard}/api/serve/applications/",
                                                headers=headers, timeout=30).json()
        config = {"http_options": {"host": "127.0.0.1", "port": int(url.split(":")[2].split("/")[0])},
                  "applications": [deployed["applications"]["serve-echo"]["deployed_app_config"]]}
        _shutdown(dashboard, headers)
        config_file = work / "serve.yaml"
        config_file.write_text(json.dumps(config))
        # Ray's own CLI, authenticated the documented way (docs/train-track-serve.md).
        ray_env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path}
        serve_cli = str(Path(sys.executable).with_name("serve"))
        started = time.monotonic()
        subprocess.run([serve_cli, "deploy", str(config_file), "-a", dashboard], cwd=ROOT,
                       env=ray_env, check=True, capture_output=True)
        _answered(url)
        theirs = time.monotonic() - started
        _shutdown(dashboard, headers)
        ratios.append(ours / theirs)
        print(f"rep {rep + 1}: invoke serve-deploy {ours:.2f}s   ray serve deploy {theirs:.2f}s"
              f"   ratio {ours / theirs:.3f}", flush=True)
    print(f"median ratio invoke serve-deploy / serve deploy (to first answer): "
          f"{statistics.median(ratios):.3f} (target <= 1.10, {reps} reps)")
    return ratios


def main() -> None:
    args = common.options(__doc__, 3, quick="one pair (for CI)")
    with common.local_cluster("rf-bench-serve-") as (spec, env, work):
        measure(spec, env, args.reps, work)


if __name__ == "__main__":
    main()

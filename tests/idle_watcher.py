"""A provider's autodown action run the way a head runs it: `python -m infra.node.autodown
--config ...` once, for a cluster whose Ray does not answer (its dashboard URL is a closed port,
which the watcher counts as idle). What keeps a real cluster busy is proven with real Ray in
tests/local/test_e2e_autodown.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from infra.node import autodown, rayproc
from tests.conftest import ROOT


def run_idle_watcher(folder: Path, cluster_id: str, action: str, action_args: dict[str, Any],
                     idle_minutes: float) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """The watcher's run of idle cluster `idle` (id `cluster_id`) with `action` (module:function)
    and its arguments, to its end; (that run, its config file, its marker file), in `folder`."""
    marker = folder / "marker.json"
    config = folder / "autodown.json"
    autodown.write_config(config, autodown.Config(
        cluster="idle", cluster_id=cluster_id, idle_minutes=idle_minutes, marker=str(marker),
        dashboard_url=f"http://127.0.0.1:{rayproc.free_port()}", poll_s=0.2,
        action=action, action_args=action_args))
    done = subprocess.run([sys.executable, "-m", "infra.node.autodown", "--config", str(config)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done, config, marker

"""What a local cluster's tests read about it beside rayfleet's printing: its state file, its
dashboard's address and token, its processes (shared by the modules that start local clusters)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from infra.node import rayproc
from tests.local.temp_dirs import temp_dir_pattern


def read_state(home: Path, name: str) -> dict:
    return json.loads((home / "state" / f"{name}.json").read_text())


def dashboard_client(home: Path, name: str) -> tuple[str, dict[str, str]]:
    """The cluster's dashboard URL and the headers that authenticate to it (its token)."""
    info = read_state(home, name)["info"]
    token = Path(info["auth_token_path"]).read_text().strip()
    return info["dashboard_url"], {"Authorization": f"Bearer {token}"}


def cluster_pids(name: str, port_base: int | None = None) -> list[int]:
    """Any process of a cluster with this name, found by its temp dir in whatever private parent
    (a crashed `up` included: `<TMPDIR>/rf-<8 random characters>/<name>`), and by its GCS port."""
    markers: list[str | re.Pattern[str]] = [temp_dir_pattern(name)]
    if port_base is not None:
        markers.append(rayproc.gcs_marker(port_base))
    return rayproc.cluster_processes(markers)

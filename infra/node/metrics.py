"""The cluster's Prometheus as it runs on the head: its config and its supervisor.

`python -m infra.node.metrics --config FILE` writes a Prometheus config beside FILE that scrapes
every node Ray lists in its own service-discovery file (Ray's metrics agent rewrites it as nodes
come and go, so autoscaled nodes appear by themselves), then runs the distribution's `prometheus`
in the foreground with a bounded history (days and size, whichever is reached first). Everything
it writes stays in the directories the config names: the config's own dir and the storage dir.
It ships in the node package like the tracking supervisor (infra/node/tracking.py); the laptop's
side is infra/core/metrics/prometheus.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.node.files import atomic_write
from infra.node.serverproc import run_server
from infra.node.wire import VERSION, Wire

#: The supervisor's config on a local head, inside the cluster's own temp dir (so that the
#: provider's process markers find the supervisor and Prometheus, its child).
CONFIG_FILE = "rayfleet-metrics.json"
#: Ray's service-discovery file (ray._private.ray_constants.PROMETHEUS_SERVICE_DISCOVERY_FILE);
#: Ray writes it in the session dir and links it from the root of its temp dir.
DISCOVERY_FILE = "prom_metrics_service_discovery.json"
#: The distribution's Prometheus, for a supervisor started with a PATH that lacks /usr/bin.
FALLBACK_PROGRAMS = ("/usr/bin/prometheus",)


@dataclass(frozen=True)
class PrometheusConfig(Wire):
    """What the supervisor needs to run one Prometheus; paths only."""

    KIND = "the Prometheus daemon's config"

    host: str
    port: int
    #: Ray's service-discovery file on the head.
    discovery_file: str
    #: The time-series database (bounded by `retention_days` and `retention_size_mb`).
    storage_dir: str
    retention_days: int
    retention_size_mb: int
    scrape_interval_s: int
    log_path: str
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)



def find_program() -> str | None:
    """The `prometheus` binary of this head: the PATH first, then where our installer puts it."""
    found = shutil.which("prometheus")
    if found:
        return found
    # conda-forge's, installed into the node env beside this interpreter (setup/install.sh).
    beside = Path(sys.executable).with_name("prometheus")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    for candidate in FALLBACK_PROGRAMS:
        path = Path(os.path.expanduser(candidate))
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def scrape_config(config: PrometheusConfig) -> str:
    """prometheus.yml: Ray's nodes from its discovery file, re-read every few seconds (Ray
    replaces the file, and a symlinked one escapes inotify)."""
    interval = f"{config.scrape_interval_s}s"
    return json.dumps({
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": f"{min(config.scrape_interval_s, 10)}s"},
        "scrape_configs": [{
            "job_name": "ray",
            "file_sd_configs": [{"files": [config.discovery_file], "refresh_interval": "5s"}],
        }],
    }, indent=2)  # JSON is YAML: no YAML library needed on the head.


def server_command(program: str, config: PrometheusConfig, config_file: Path) -> list[str]:
    return [
        program,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={config.storage_dir}",
        f"--storage.tsdb.retention.time={config.retention_days}d",
        f"--storage.tsdb.retention.size={config.retention_size_mb}MB",
        f"--web.listen-address={config.host}:{config.port}",
        "--log.level=warn",
    ]


def supervise(config: PrometheusConfig, config_path: Path) -> int:
    """Run Prometheus in the foreground, below Ray's CPU priority; stop it on SIGTERM."""
    program = find_program()
    if program is None:
        print("no prometheus on this head (install the distribution's `prometheus` package); "
              "the cluster runs without metrics", file=sys.stderr)
        return 3
    storage = Path(config.storage_dir)
    storage.mkdir(parents=True, exist_ok=True)
    yml = config_path.with_name(config_path.stem + ".yml")
    atomic_write(yml, scrape_config(config))
    # cwd: the storage dir, so that nothing Prometheus writes by a relative path lands outside
    # the cluster's own dirs.
    return run_server(server_command(program, config, yml), config.log_path, cwd=str(storage),
                      grace_s=10.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a cluster's Prometheus.")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    # A head's daemon config also names the node package it came with (autodown_remote).
    config = PrometheusConfig.from_json(Path(args.config).read_text())
    # Runs under infra/node/supervise.py, whose pid file (`<config>.pid`, JSON by identity) is
    # its own: writing a bare pid there made the supervisor unknown to `ensure` and `status`.
    return supervise(config, Path(args.config))


if __name__ == "__main__":
    sys.exit(main())

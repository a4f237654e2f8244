"""`metrics: prometheus` on a head this machine reaches over SSH (Lambda, GCP): starting it.

The Prometheus supervisor (infra/node/metrics.py) goes on the head like the tracking server's,
through `HeadAccess.ensure_daemon`, the head daemons' one supervisor. It
listens on the head's loopback, where the dashboard listens: the cluster's SSH tunnel reaches it
(`tracking_remote.connect`), no firewall rule opens it. Its database lives in the head's own
`~/rayfleet/metrics/`, bounded by the spec's `metrics_history`, and goes with the head; teardown
first keeps a copy here (infra/app/metrics_history.py), through the same tunnel.

Core layer: never imports a provider.
"""

from __future__ import annotations

from infra.core.head import HeadAccess
from infra.core.metrics import prometheus as metrics
from infra.core.progress import Progress, timed
from infra.core.spec import MetricsHistory
from infra.core.state import State
from infra.node.metrics import DISCOVERY_FILE, PrometheusConfig

#: The supervisor's config (and pid file beside it) on the head.
HEAD_CONFIG = "~/.rayfleet/metrics.json"
HEAD_LOG = "~/rayfleet/metrics-supervisor.log"
#: Ray's temp dir on a head started without --temp-dir (its discovery file is linked there).
RAY_TEMP_DIR = "/tmp/ray"
#: For `ray start` on the head: Ray's dashboard reads the cluster's Prometheus there.
NODE_ENV = {"RAY_PROMETHEUS_HOST": f"http://127.0.0.1:{metrics.HEAD_PORT}"}


def node_env_words() -> str:
    """`VAR=value ` words for the head's `ray start`."""
    return "".join(f"{key}={value} " for key, value in NODE_ENV.items())


def start(state: State, head: HeadAccess, history: MetricsHistory, progress: Progress) -> None:
    """Start (or keep) the head's Prometheus; not waited for (it needs nothing from `up`)."""
    home = head.run('printf %s "$HOME"', timeout=30, check=True).stdout.strip()
    config = PrometheusConfig(
        host="127.0.0.1", port=metrics.HEAD_PORT,
        discovery_file=f"{RAY_TEMP_DIR}/{DISCOVERY_FILE}",
        storage_dir=f"{home}/rayfleet/metrics/tsdb", retention_days=history.days,
        retention_size_mb=history.size_mb, scrape_interval_s=history.scrape_interval_s,
        log_path=f"{home}/rayfleet/prometheus.log")
    with timed(progress, f"starting Prometheus on the head (127.0.0.1:{metrics.HEAD_PORT})"):
        head.ensure_daemon("infra.node.metrics", HEAD_CONFIG, config.to_json(indent=None),
                           log=HEAD_LOG)
    metrics.note_started(state, history.scrape_interval_s)

"""The local head's daemons beside Ray: the MLflow tracking server, Prometheus and the idle
watcher, each supervised on this machine (`LocalHead.ensure_daemon`) with its config in the
cluster's temp dir, which makes it one of the cluster's processes for teardown and autodown."""

from __future__ import annotations

from pathlib import Path

from infra.core import paths, ui
from infra.core.autodown import view as autodown_view
from infra.core.endpoint import Endpoint
from infra.core.head import LocalHead
from infra.core.state import State
from infra.core.tracking import client as tracking
from infra.node import rayproc
from infra.node.local import autodown as local_autodown
from infra.providers.local.spec import Spec


def ensure_tracking(spec: Spec, state: State, tmp: str, block: rayproc.PortBlock) -> None:
    """Start the MLflow tracking server (infra/node/tracking.py) unless it runs already.

    The store lives in `.rayfleet/tracking/<cluster>/` and outlives the cluster.
    """
    if spec.tracking != "mlflow":
        return
    config_path = Path(tmp) / tracking.CONFIG_FILE
    store = tracking.local_store(spec.name)
    if state.info.tracking_store != str(store):
        state.set_info(tracking_store=str(store))
    password = tracking.ensure_credentials(spec.name)
    log = paths.home() / "logs" / spec.name / "mlflow.log"
    config = tracking.ServerConfig(
        host="127.0.0.1", port=block.tracking, store_dir=str(store),
        password_path=str(password),
        secret_key_path=str(password.with_name(tracking.SECRET_KEY_FILE)),
        log_path=str(log))
    _daemon("infra.node.tracking", config_path, config.to_json(), log, wait=False)


def ensure_metrics(spec: Spec, state: State, tmp: str, block: rayproc.PortBlock) -> None:
    """Start the cluster's Prometheus (infra/node/metrics.py) unless it runs already; never
    waited for. Its bounded database lives in `.rayfleet/metrics/<cluster>/tsdb`."""
    if spec.metrics != "prometheus":
        return
    # Here, not at the top: a cluster without metrics (the local default) does not load
    # them on its way to `ray start` (bench/local_up.py).
    from infra.core.metrics import prometheus as metrics

    if not metrics.program_here():
        ui.warn("metrics: no `prometheus` on this machine (apt-get install prometheus); the "
                "cluster runs without metrics")
        return
    history = spec.metrics_history
    log = paths.home() / "logs" / spec.name / "prometheus.log"
    config = metrics.PrometheusConfig(
        host="127.0.0.1", port=block.prometheus,
        discovery_file=str(Path(tmp) / metrics.DISCOVERY_FILE),
        storage_dir=str(metrics.local_storage(spec.name)),
        retention_days=history.days, retention_size_mb=history.size_mb,
        scrape_interval_s=history.scrape_interval_s, log_path=str(log))
    if _daemon("infra.node.metrics", Path(tmp) / metrics.CONFIG_FILE,
               config.to_json(), log, wait=False):
        metrics.note_started(state, history.scrape_interval_s)


def ensure_watcher(spec: Spec, state: State, tmp: str, block: rayproc.PortBlock,
                   endpoint: Endpoint, new_head: bool = False) -> None:
    """Start the idle watcher (infra/node/autodown.py) beside the head unless one runs already.

    It runs detached from this command, so the cluster removes itself with this terminal and
    this machine's user gone.
    """
    marker = autodown_view.marker_path(spec.name)
    if spec.autodown is None:
        marker.unlink(missing_ok=True)
        return
    # Here, not at the top: a cluster without autodown (the local default) does not load
    # the watcher's module on its way to `ray start`.
    from infra.node import autodown

    if new_head:
        # A watcher that died on a head that lives on keeps its countdown (it resumes from
        # the marker); a new head starts a new one.
        marker.unlink(missing_ok=True)
    config = autodown.Config(
        cluster=spec.name, cluster_id=state.cluster_id,
        idle_minutes=spec.autodown.idle_minutes, dashboard_url=endpoint.dashboard_url,
        marker=str(marker), action=local_autodown.ACTION,
        action_args={"temp_dir": tmp, "port_base": block.base},
        token_path=str(endpoint.token_path) if endpoint.token_path else None)
    log = paths.home() / "logs" / spec.name / "autodown.log"
    if _daemon("infra.node.autodown", Path(tmp) / local_autodown.CONFIG_FILE,
               autodown.config_text(config), log):
        ui.info(f"autodown: the cluster stops itself after "
                f"{spec.autodown.idle_minutes:g} idle minutes (watcher log {log})")


def here() -> LocalHead:
    """The head as its daemons see it: this machine (their start, stop and status need none of
    the Ray environment that `head_access` adds for `invoke ssh|exec`)."""
    return LocalHead(where="this machine")


def _daemon(module: str, config_path: Path, config_text: str, log: Path,
            wait: bool = True) -> bool:
    """Start a daemon of the cluster beside its head unless one runs (`LocalHead.ensure_daemon`:
    supervised, one that dies is back within seconds); True when this call started it. One that
    runs keeps the config it started with: a changed spec reaches it with a new head
    (`teardown`, then `up`; `Capabilities.applied_by_up`)."""
    return here().ensure_daemon(module, str(config_path), config_text, log=str(log),
                                replace=False, wait=wait)

"""The `local` provider: a real Ray head on this machine, fenced off from any other Ray here.

The cluster owns a private port block and temp dir, binds its dashboard to 127.0.0.1, and is stopped
by finding exactly its own processes (see infra/node/rayproc.py), never with `ray stop`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

from infra.core import auth, drift, jobs, paths, remote_head, render, ui
from infra.core.autodown import view as autodown_view
from infra.core.errors import ClusterNotRunningError, ProviderError
from infra.core.head import HeadAccess, LocalHead
from infra.core.state import State
from infra.core.tracking import client as tracking
from infra.node import rayproc
from infra.node.local import autodown as local_autodown
from infra.node.where import ray_executable
from infra.providers.base import (
    Cost,
    Endpoint,
    Plan,
    PlannedResource,
    ProviderStatus,
    Readiness,
    with_autodown,
)
from infra.providers.base import Provider as BaseProvider
from infra.providers.features import HeadServices, autodown_report
from infra.providers.local import daemons
from infra.providers.local.records import Head
from infra.providers.local.spec import Spec

#: Where the cost of a local cluster comes from (it has none).
FREE = "runs on this machine"
# Port blocks are derived from the cluster name inside this range, away from Ray's defaults
# (6379, 8265, 10001) and below the usual ephemeral range (32768+).
_FIRST_BASE, _BLOCKS = 20000, 90


class LocalError(ProviderError):
    """The local Ray head could not be started or stopped."""


#: The longest socket path Ray puts under its temp dir, past the temp dir itself:
#: `/session_<date>_<microseconds>_<pid>/sockets/dash_MetricsHead`.
_RAY_SOCKET_TAIL = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/dash_MetricsHead")
#: Linux's limit for a unix socket path (108 bytes with the terminating NUL).
_SOCKET_PATH_MAX = 107


def new_temp_dir(cluster: str) -> tuple[str, str]:
    """(parent, temp dir) for a new head: a fresh 0700 parent with an unpredictable name, as
    `mktemp -d` makes it, under $TMPDIR (else /tmp), and Ray's temp dir, named after the cluster,
    inside it.

    Ray makes its temp dir world-writable, so only the private parent keeps other users out; a
    fixed path would let another user create it first. It is not under RAYFLEET_HOME: Ray's unix
    sockets live below it, and their paths must stay under 108 bytes. Unique (random parent), it
    marks every process of this cluster and no other.
    """
    import tempfile

    parent = tempfile.mkdtemp(prefix="rf-")
    tmp = f"{parent}/{cluster}"
    if len(tmp.encode()) + _RAY_SOCKET_TAIL > _SOCKET_PATH_MAX:
        os.rmdir(parent)
        raise LocalError(f"temp dir {tmp}: too long for Ray's socket paths (at most "
                         f"{_SOCKET_PATH_MAX - _RAY_SOCKET_TAIL} characters); shorten the cluster "
                         "name or set TMPDIR to a shorter folder, e.g. /tmp")
    return parent, tmp


def _placeholder_temp_dir(cluster: str) -> str:
    import tempfile

    return f"{tempfile.gettempdir()}/rf-XXXXXXXX/{cluster}"


def _usage_stats() -> str:
    # Off unless the user explicitly opted in through Ray's own variable.
    return "1" if os.environ.get("RAY_USAGE_STATS_ENABLED") == "1" else "0"



class Provider(BaseProvider[Spec, rayproc.PortBlock]):
    name = "local"
    # The head's processes stopped and started again read the token file at start.
    restarts_by_recreating = True

    def _block(self, state: State | None) -> rayproc.PortBlock:
        head = state.resources(Head) if state else []
        if head:
            return rayproc.PortBlock(head[0].attrs.port_base)
        if self.spec.port_base is not None:
            return rayproc.PortBlock(self.spec.port_base)
        first = zlib.crc32(self.spec.name.encode()) % _BLOCKS
        for i in range(_BLOCKS):
            block = rayproc.PortBlock(_FIRST_BASE + ((first + i) % _BLOCKS) * 128)
            if rayproc.block_is_free(block):
                return block
        raise LocalError("no free port block between 20000 and 31520; set port_base in the spec")

    def _start_script(self, block: rayproc.PortBlock) -> str:
        mb = self.spec.object_store_memory_mb
        token = auth.token_path(self.spec.name) if self.spec.auth == "token" else None
        tracking_env: dict[str, str] = {}
        tracking_files: dict[str, str] = {}
        if self.spec.tracking == "mlflow":
            tracking_env, tracking_files = tracking.node_env(
                f"http://127.0.0.1:{block.tracking}", str(tracking.password_path(self.spec.name)))
        ray = ray_executable()
        return render.render(
            "local.start.sh.j2",
            cluster=self.spec.name,
            address=f"127.0.0.1:{block.gcs}",
            ray_script=str(paths.setup_dir() / "users" / "ray.sh"),
            ray_bin=str(Path(ray).parent),
            usage_stats=_usage_stats(),
            auth_env=auth.node_env(str(token)) if token else {"RAY_AUTH_MODE": "disabled"},
            port_flags=block.flags(),
            num_cpus=self.spec.num_cpus,
            num_gpus=self.spec.num_gpus,
            object_store_memory=mb * 1024 * 1024 if mb else None,
            resources=self.spec.resources,
            tracking_env=tracking_env,
            tracking_files=tracking_files,
            metrics_env=self._metrics_env(block),
        )

    def _metrics_env(self, block: rayproc.PortBlock) -> dict[str, str]:
        if self.spec.metrics != "prometheus":
            return {}
        return {"RAY_PROMETHEUS_HOST": f"http://127.0.0.1:{block.prometheus}",
                "AUTOSCALER_METRIC_PORT": str(block.autoscaler_metrics),
                "DASHBOARD_METRIC_PORT": str(block.dashboard_metrics)}

    def _temp_dir(self, state: State | None) -> str:
        heads = state.resources(Head) if state else []
        if heads:
            return heads[0].id
        # `plan` before `up` shows a placeholder; `up` makes the folder (new_temp_dir).
        return _placeholder_temp_dir(self.spec.name)

    def plan(self, state: State | None) -> Plan[rayproc.PortBlock]:
        block = self._block(state)
        exists = bool(state and state.resources(Head))
        cpus = self.spec.num_cpus or os.cpu_count()
        tmp = self._temp_dir(state)
        detail = (
            f"{cpus} CPUs, ports {block.base}-{block.base + rayproc.BLOCK_SIZE - 1}, "
            f"dashboard http://127.0.0.1:{block.dashboard}, temp dir {tmp}"
        )
        auth_note = ("token auth on: clients present the token in "
                     f"{auth.token_path(self.spec.name)}" if self.spec.auth == "token"
                     else "token auth OFF (auth: none): anyone who reaches the ports can run jobs")
        return Plan(
            resources=[PlannedResource("Ray head (processes on this machine)", self.spec.name,
                                       detail, exists)],
            files={"start.sh": self._start_script(block)},
            notes=["free: runs on this machine; the dashboard and job API listen on 127.0.0.1 only",
                   auth_note],
            # The block start.sh was rendered for: `up` starts and reaches the head on it.
            extra=block,
        )

    def _endpoint(self, block: rayproc.PortBlock, state: State) -> Endpoint:
        mlflow = self.spec.tracking == "mlflow"
        return remote_head.direct(f"127.0.0.1:{block.gcs}", auth.token_file(state),
                                  ("127.0.0.1", block.dashboard), ("127.0.0.1", block.serve_http),
                                  ("127.0.0.1", block.tracking) if mlflow else None,
                                  tracking.password_path(self.spec.name) if mlflow else None,
                                  ("127.0.0.1", block.prometheus)
                                  if self.spec.metrics == "prometheus" else None)

    def create(self, state: State, plan: Plan[rayproc.PortBlock]) -> Endpoint:
        block = plan.extra
        endpoint = self._endpoint(block, state)
        token = endpoint.token_path
        if state.resources(Head):
            if jobs.dashboard_ready(endpoint.dashboard_url, token):
                ui.info(f"cluster {self.spec.name!r} is already running")
                # A daemon the running head was started with comes back if it died; one the spec
                # added since needs a new head (Ray's own settings for it are in start.sh), as
                # `up` then says: starting it alone would give half of it.
                tmp = self._temp_dir(state)
                if self.as_started("tracking"):
                    daemons.ensure_tracking(self.spec, state, tmp, block)
                if self.as_started("metrics"):
                    daemons.ensure_metrics(self.spec, state, tmp, block)
                daemons.ensure_watcher(self.spec, state, tmp, block, endpoint)
                return endpoint
            ui.info(f"cluster {self.spec.name!r} is in state but not answering; restarting it")
            self._stop(state)
        elif not rayproc.block_is_free(block):
            raise LocalError(
                f"ports {block.base}-{block.base + rayproc.BLOCK_SIZE - 1} are in use; "
                "change port_base in the spec or leave it unset"
            )
        parent, tmp = new_temp_dir(self.spec.name)
        # Recorded before the start: a crash from here on leaves processes teardown can find.
        state.add(tmp, Head(port_base=block.base, temp_parent=parent,
                            started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")))
        self._start_head(plan.files["start.sh"], tmp, block)
        ui.wait_for(
            lambda _: True if jobs.dashboard_ready(endpoint.dashboard_url, token) else None,
            f"dashboard at {endpoint.dashboard_url} to accept jobs",
            timeout=self.spec.ready_timeout_s,
            hint=f"see the logs under {tmp}",
        )
        state.set_info(address=endpoint.address, dashboard_url=endpoint.dashboard_url)
        # Started once Ray answers and not waited for: its start (a few CPU-seconds of imports,
        # below Ray's priority, see infra/node/tracking.py) would otherwise compete with Ray's and
        # slow `up` (bench/tracking_up.py). Nodes know its URL already; MLflow's client retries
        # while it comes up.
        daemons.ensure_tracking(self.spec, state, tmp, block)
        daemons.ensure_metrics(self.spec, state, tmp, block)
        daemons.ensure_watcher(self.spec, state, tmp, block, endpoint, new_head=True)
        return endpoint

    def _start_head(self, script: str, tmp: str, block: rayproc.PortBlock) -> None:
        """Run start.sh (`ray start --head` on the block, in `tmp`); its output goes to a log."""
        if self.spec.tracking == "mlflow":
            tracking.ensure_credentials(self.spec.name)  # start.sh reads the password file
        log = paths.home() / "logs" / self.spec.name / "ray-start.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            # The temp dir is start.sh's argument: `plan` renders it before the folder exists.
            # Started before the step's line is printed: that first output loads the terminal
            # library, which then runs beside `ray start` instead of before it (bench/local_up.py).
            starting = subprocess.Popen(["bash", "-c", script, "start.sh", tmp],
                                        stdout=out, stderr=subprocess.STDOUT)
            try:
                with ui.step(f"starting Ray head (ports {block.base}+, log {log})"):
                    returncode = starting.wait()
            except BaseException:
                # As subprocess.run does: a start given up on (Ctrl+C) does not run on; what it
                # started already is in state (the head above), for teardown.
                starting.kill()
                starting.wait()
                raise
        if returncode != 0:
            tail = log.read_text().strip().splitlines()[-3:]
            raise LocalError(f"`ray start` failed ({' | '.join(tail)}); full log: {log}")

    def as_started(self, field: str) -> bool:
        """The running cluster has `field` as the spec has it now (per the spec its last `up` put
        in effect; a cluster from before that record is taken to match)."""
        applied = drift.read_applied(self.spec.name)
        now = drift.snapshot(self.spec)
        return applied is None or applied.get(field) == now.get(field)

    def head_services(self, state: State) -> HeadServices | None:
        """The head's daemons start beside Ray (`create`); the watcher writes its marker here
        itself, read with whether it (or its supervisor) runs."""
        heads = state.resources(Head)
        if not heads or self.spec.autodown is None:
            return None
        config = str(Path(heads[0].id) / local_autodown.CONFIG_FILE)

        def marker(left: bool | None) -> str | None:
            text, status = daemons.here().read_with_status(
                str(autodown_view.marker_path(self.spec.name)), config)
            return autodown_view.with_watcher_status(text, status)

        return HeadServices(marker=marker)

    def _markers(self, state: State) -> list[str | re.Pattern[str]]:
        markers: list[str | re.Pattern[str]] = []
        for head in state.resources(Head):
            markers += local_autodown.markers(head.id, head.attrs.port_base)
        return markers

    def _stop(self, state: State) -> None:
        try:
            local_autodown.stop(self._markers(state), lambda count: ui.step(
                f"stopping {count} Ray processes of {self.spec.name!r}"))
        except local_autodown.StopError as exc:
            if exc.why == "belong to another user":
                raise LocalError(
                    f"processes {exc.pids} match cluster {self.spec.name!r} but belong to another "
                    "user; rayfleet signals only its own processes: ask their owner to stop them"
                ) from None
            raise LocalError(f"processes {exc.pids} of {self.spec.name!r} {exc.why}") from None
        for head in state.resources(Head):
            shutil.rmtree(head.id, ignore_errors=True)
            parent = head.attrs.temp_parent
            if parent:  # clusters started before the private parent have none
                shutil.rmtree(str(parent), ignore_errors=True)
            state.remove(Head, head.id)

    def status(self, state: State) -> ProviderStatus:
        heads = state.resources(Head)
        if not heads:
            return ProviderStatus(False, "not running")
        pids = rayproc.cluster_processes(self._markers(state))
        report = autodown_report(self, state, fetch=True, left=bool(pids))
        if not pids and report is not None and report.removed_at:
            return with_autodown(ProviderStatus(False, "", cost=Cost(0, 0.0, source=FREE)),
                                 report, f"no process of local cluster {self.spec.name!r} "
                                 "is left")
        block = rayproc.PortBlock(heads[0].attrs.port_base)
        endpoint = self._endpoint(block, state)
        answering = jobs.dashboard_ready(endpoint.dashboard_url, endpoint.token_path)
        # The state says a head was started, so the provider's view is "running"; whether Ray
        # answers is reported by `invoke status` next to it.
        running = True
        summary = (
            f"local Ray head {'running' if answering else 'NOT answering'}: "
            f"{len(pids)} processes, ports {block.base}-{block.base + rayproc.BLOCK_SIZE - 1}"
        )
        rows = [{"resource": h.kind, "temp dir": h.id, "port base": str(h.attrs.port_base),
                 "processes": str(len(pids))} for h in heads]
        started = heads[0].attrs.started_at
        uptime = ((dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(started))
                  .total_seconds() if started else None)
        cost = Cost(1 if pids else 0, 0.0, uptime, 0.0, source=FREE)
        return ProviderStatus(running, summary, rows, state="running" if answering else
                              "NOT answering", cost=cost, autodown=report)

    def _running_block(self, state: State) -> rayproc.PortBlock:
        heads = state.resources(Head)
        if not heads:
            raise ClusterNotRunningError(
                f"local cluster {self.spec.name!r} is not running; start it with `invoke up`"
            )
        return rayproc.PortBlock(heads[0].attrs.port_base)

    @contextlib.contextmanager
    def connect(self, state: State) -> Iterator[Endpoint]:
        yield self._endpoint(self._running_block(state), state)

    def head_access(self, state: State) -> HeadAccess:
        """The head is this machine: commands run here, with Ray's own variables pointing at it
        (drivers and `ray status` at the GCS, the job CLI at the job API, the token by path)."""
        block = self._running_block(state)
        endpoint = self._endpoint(block, state)
        env = {"RAY_ADDRESS": endpoint.address, "RAY_API_SERVER_ADDRESS": endpoint.dashboard_url,
               **auth.client_env(state)}
        return LocalHead(where="this machine", env=env, dashboard_port=block.dashboard,
                         client_port=None,
                         tracking_password=str(tracking.password_path(self.spec.name)))

    def readiness(self) -> list[Readiness]:
        ray = ray_executable()
        if not Path(ray).exists() and shutil.which(ray) is None:
            return [Readiness("Ray CLI", False, "no `ray` beside this Python or on PATH",
                              "pip install -e . (installs Ray) in this checkout's venv")]
        from importlib.metadata import version

        return [Readiness("Ray CLI", True, f"{ray} (ray {version('ray')})")]

    def teardown(self, state: State) -> None:
        self._stop(state)


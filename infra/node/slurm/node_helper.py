"""The part of the Slurm provider that runs on the compute nodes, inside the batch script.

The nodes do not have rayfleet installed: the batch script carries the node package as one zip
(infra/core/shipping.py), each node unpacks it into its private dir and runs this module from it with
the Python that runs Ray (`rf_helper` in templates/slurm.environment.j2):

    PYTHONPATH=ZIP python -m infra.node.slurm.node_helper COMMAND ARGS...

    prepare INFO_FILE FIRST STRIDE BLOCKS    # print a free port base, write the first info file
    block BASE                               # this node's free base
    autodown-config OUT IDLE_MINUTES CLUSTER # the idle watcher's config
    tracking-config OUT STORE PASSWORD SECRET# the MLflow server's config
    metrics-config OUT STORE DAYS MB SECONDS # Prometheus's config (metrics: prometheus)
    stop MARKER...                           # stop this job's Ray, rm temp
    await INFO_FILE NODES TIMEOUT PID:NODE...# until the head saw NODES
    start RAY_START_ARGS...                  # `ray start`, see start() (on the head: also `watch`)

It imports the standard library, the node package (rayproc: port block layout, scoped process
stop, with psutil, which Ray ships; files; retry; metrics: where Prometheus is, its config) and
Ray for `start` (raycli: Ray's CLI without the command groups a start never uses).
Everything about the job comes from the RF_* variables the batch script exports.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from infra.node import metrics, raycli
from infra.node.files import atomic_write
from infra.node.rayproc import (
    PORT_NAMES,
    PortBlock,
    alive,
    block_is_free,
    cluster_processes,
    port_answers,
    terminate,
)
from infra.node.slurm.info import Info
from infra.node.wait import WaitTimeout, until
from infra.node.wire import Wire, WireError


def _env(name: str) -> str:
    return os.environ.get(name, "")


def free_block(job_id: int, first: int, stride: int, blocks: int) -> int:
    """The first free block on this node, starting from the one the job id picks, so two jobs
    never share one."""
    for i in range(blocks):
        base = first + ((job_id + i) % blocks) * stride
        if block_is_free(PortBlock(base)):
            return base
    raise SystemExit(f"rayfleet: no free block of Ray ports from {first} on this node")


def node_block(preferred: int) -> int:
    """This node's free block, starting from the head's (the job's) and going on in the range:
    a worker's Ray ports are its own, only the head's GCS address is shared."""
    first, stride, blocks = (int(_env(k)) for k in ("RF_PORT_FIRST", "RF_PORT_STRIDE",
                                                    "RF_PORT_BLOCKS"))
    return free_block((preferred - first) // stride, first, stride, blocks)


def stop(markers: list[str], grace: float = 1.0) -> int:
    """Stop the processes naming a marker (this job's temp dirs) and their descendants."""
    pids = cluster_processes(list(markers))
    left = terminate(pids, grace=grace) if pids else []
    for marker in markers:
        if marker.startswith("/") and Path(marker).is_dir():
            shutil.rmtree(marker, ignore_errors=True)
    if left:
        print(f"rayfleet: processes {left} survived SIGKILL", file=sys.stderr)
    return 1 if left else 0


def info_now(phase: str, message: str = "", **ready: Any) -> Info:
    """The job's info file as it stands now, in `phase` (with `message`; `ready`: the fields a
    ready head adds), from the job's RF_* environment."""
    base = int(_env("RF_BASE") or 0)
    block = PortBlock(base)
    head_ip = _env("RF_HEAD_IP")
    return Info(
        phase=phase, message=message, job_id=_env("RF_JOB_ID"), head_node=_env("RF_HEAD_NODE"),
        head_ip=head_ip, port_base=base, gcs_port=block.gcs, dashboard_port=block.dashboard,
        client_port=base + PORT_NAMES.index("ray-client-server-port"),
        node_manager_port=base + PORT_NAMES.index("node-manager-port"),
        object_manager_port=base + PORT_NAMES.index("object-manager-port"),
        address=f"{head_ip}:{block.gcs}", dashboard_url=f"http://127.0.0.1:{block.dashboard}",
        temp_dir=_env("RF_HEAD_TEMP"), cluster_id=_env("RF_CLUSTER_ID"),
        started_at=float(_env("RF_STARTED_AT") or 0), updated_at=time.time(),
        prometheus=prometheus_program(), **ready)


@functools.cache
def prometheus_program() -> str | None:
    """`metrics: prometheus` (RF_METRICS set): which `prometheus` the head's job will run, "" for
    none, so that `up` says in one line that the cluster runs without metrics. Looked up where
    the job runs, after the spec's environment (modules, activate) is set up: the login host's
    PATH says nothing about the compute nodes'."""
    if not _env("RF_METRICS"):
        return None
    return metrics.find_program() or ""


def write_info(path: str, info: Info) -> None:
    """Replace the info file atomically: the client polls it and must never read half of it."""
    atomic_write(path, info.to_json(indent=None))


def watch(path: str, want: int, timeout: float) -> None:
    """Poll the GCS until `want` nodes are alive, then write the info file as ready.

    Runs as a thread of the head's `helper start`, beside `ray start --head` in the same process:
    Ray is imported there already. A separate observer process paid a second import of Ray (~1 s
    of CPU) exactly while the head's dashboard, agents and raylet start on the same cores.
    """
    head_ip, gcs_port = _env("RF_HEAD_IP"), PortBlock(int(_env("RF_BASE"))).gcs
    deadline = time.monotonic() + timeout
    # Where the start-up time goes (epoch seconds; also printed to the job's output): the GCS
    # listening, the head node registered, the last node registered.
    timeline: dict[str, float] = {"setup_done": float(_env("RF_SETUP_DONE") or 0)}
    try:
        until(lambda: port_answers(head_ip, gcs_port, timeout=0.2),
              max(0.0, deadline - time.monotonic()), 0.1, "the head's GCS to listen")
    except WaitTimeout:
        return  # `await` reports the timeout
    timeline["gcs_listening"] = time.time()
    import ray
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    client: Any = None
    seen = -1

    def settled() -> bool:
        """True once the info file says ready (or `await` already gave its verdict)."""
        nonlocal client, seen
        nodes: list[Any] = []
        try:
            # A GcsClient made before the GCS listens waits 40 s to fail: knock first.
            if client is None and port_answers(head_ip, gcs_port, timeout=0.2):
                client = GcsClient(address=f"{head_ip}:{gcs_port}")
            if client is not None:
                nodes = [n for n in client.get_all_node_info(timeout=2).values() if n.state == 0]
        except Exception:  # the GCS is not up yet (or restarting): keep polling
            client = None
        if _phase(path) != "starting":
            return True  # `await` gave up (a step died or the time ran out): leave its verdict
        if len(nodes) != seen:
            seen = len(nodes)
            if any(n.is_head_node for n in nodes):
                timeline.setdefault("head_alive", time.time())
            if seen < want:
                write_info(path, info_now("starting", f"{seen}/{want} Ray nodes alive"))
        if seen < want:
            return False
        timeline["all_alive"] = time.time()
        write_ready(path, nodes, f"{seen}/{want} Ray nodes alive", timeline, ray.__version__)
        return True

    with contextlib.suppress(WaitTimeout):  # `await` reports the timeout
        until(settled, max(0.0, deadline - time.monotonic()), 0.1, f"{want} Ray nodes alive")


def write_ready(path: str, nodes: list[Any], detail: str, timeline: dict[str, float],
                ray_version: str) -> None:
    """The info file as ready: the alive nodes (`nodes`, the GCS's), head first, and where the
    start-up time went, printed to the job's output too."""
    start = float(_env("RF_STARTED_AT") or 0)
    print("rayfleet: start-up " + ", ".join(
        f"{name.replace('_', ' ')} +{at - start:.2f}s" for name, at in timeline.items()),
        flush=True)
    listed = sorted(
        ({"ip": n.node_manager_address, "hostname": n.node_manager_hostname,
          "head": bool(n.is_head_node), "node_manager_port": n.node_manager_port,
          "object_manager_port": n.object_manager_port} for n in nodes),
        key=lambda n: (not n["head"], n["hostname"]),
    )
    write_info(path, info_now("ready", detail, nodes=listed, ready_at=timeline["all_alive"],
                              timeline=timeline, ray_version=ray_version,
                              python_version=sys.version.split()[0]))


def _phase(path: str) -> str:
    try:
        with open(path) as handle:
            return Info.from_json(handle.read()).phase
    except (OSError, ValueError, WireError):
        return ""


def await_ready(path: str, want: int, timeout: float, steps: list[str]) -> int:
    """Wait (standard library only, no Ray import) until the head's watcher wrote the info file
    as ready; fail early when a `ray start` step died, or at the timeout."""
    step_nodes = dict(s.split(":", 1) for s in steps)

    def verdict() -> str | None:
        phase = _phase(path)
        if phase in ("ready", "failed"):
            return phase
        dead = [node for pid, node in step_nodes.items() if not alive(int(pid))]
        if dead:
            return fail(f"`ray start` on {', '.join(sorted(dead))} exited; see this job's output")
        return None

    def fail(message: str) -> str:
        write_info(path, info_now("failed", message))
        print(f"rayfleet: {message}", file=sys.stderr)
        return "failed"

    try:
        phase = until(verdict, timeout, 0.1, "the info file to say ready")
    except WaitTimeout:
        phase = fail(f"not all {want} Ray nodes alive after {timeout:.0f}s")
    return 0 if phase == "ready" else 1


def _head_registered(timeout: float) -> bool:
    """Poll (every 0.1 s) until the head's GCS answers and lists the head node as alive."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    head_ip, gcs_port = _env("RF_HEAD_IP"), PortBlock(int(_env("RF_BASE"))).gcs
    client: Any = None

    def registered() -> bool:
        nonlocal client
        try:
            if client is None and port_answers(head_ip, gcs_port, timeout=0.2):
                client = GcsClient(address=f"{head_ip}:{gcs_port}")
            return client is not None and any(
                n.state == 0 and n.is_head_node
                for n in client.get_all_node_info(timeout=2).values())
        except Exception:  # not up yet
            client = None
            return False

    try:
        return until(registered, timeout, 0.1, "the head to register")
    except WaitTimeout:
        print(f"rayfleet: the head {head_ip}:{gcs_port} did not come up in {timeout:.0f}s",
              file=sys.stderr)
        return False


def start(args: list[str]) -> int:
    """`ray start ARGS` in this process.

    Ray is imported first, while the head is still starting. A worker then waits for the head
    node to be registered: `ray start` itself looks the head up in 2-second steps (and gives up
    after 20), so started early it loses up to 2 s, started late it pays for the import.
    """
    ray_cli = raycli.main()

    timeout = float(_env("RF_READY_TIMEOUT") or 300)
    if "--head" in args:
        import threading

        # Readiness is watched from here, where Ray is imported already (see `watch`).
        threading.Thread(target=watch, args=(_env("RF_INFO"), int(_env("RF_TOTAL") or 1),
                                             timeout), daemon=True).start()
    elif not _head_registered(timeout):
        return 1
    sys.argv = ["ray", "start", *args]
    return int(ray_cli() or 0)


def prepare(path: str, first: int, stride: int, blocks: int) -> int:
    """Pick the job's port block and write the first info file; return the block's base."""
    base = free_block(int(_env("RF_JOB_ID")), first, stride, blocks)
    os.environ["RF_BASE"] = str(base)
    total = _env("RF_TOTAL") or "?"
    write_info(path, info_now("starting", f"starting Ray on {total} node(s)"))
    return base


def autodown_config(target: str, idle_minutes: float, cluster: str) -> int:
    """The idle watcher's config (infra/node/autodown.py `Config`), 0600 in the head's private dir:
    Ray's dashboard on the head's loopback, the marker beside it, Slurm's removal action, which
    copies the marker to the shared work dir (`record`) before it cancels anything."""
    from infra.node import autodown  # here: the helper's other commands do not need it

    temp, block = _env("RF_HEAD_TEMP"), PortBlock(int(_env("RF_BASE")))
    config = autodown.Config(
        cluster=cluster, cluster_id=_env("RF_CLUSTER_ID"), idle_minutes=idle_minutes,
        dashboard_url=f"http://127.0.0.1:{block.dashboard}",
        marker=os.path.join(temp, "autodown-marker.json"),
        action="infra.node.slurm.autodown:remove",
        action_args={
            "cluster_id": _env("RF_CLUSTER_ID"), "head_job_id": _env("RF_JOB_ID"),
            "marker": os.path.join(temp, "autodown-marker.json"),
            "record": os.path.join(_env("SLURM_SUBMIT_DIR"),
                                   f"{_env('SLURM_JOB_NAME')}.autodown.json"),
        },
        # A path (the token itself never leaves its 0600 file); None without token auth.
        token_path=_env("RAY_AUTH_TOKEN_PATH") if _env("RAY_AUTH_MODE") == "token" else None)
    autodown.write_config(Path(target), config)
    return 0


def tracking_config(target: str, store: str, password_path: str, secret_key_path: str) -> int:
    """The tracking server's config (the fields of infra/node/tracking.py `ServerConfig`, which
    reads it; tests/slurm/test_spec_render.py keeps the two in step) in the head's private dir:
    the head's address and the block's tracking port, the store on the shared work dir (0700:
    the runs are nobody else's), the paths of its 0600 secrets (never their content)."""
    import importlib.util

    from infra.node import tracking

    if importlib.util.find_spec("mlflow") is None:
        print("rayfleet: tracking: mlflow needs MLflow where Ray runs (pip install mlflow in the "
              "environment the spec's environment: sets up); no tracking server", file=sys.stderr)
        return 1
    return _daemon_config(target, store, tracking.ServerConfig(
        host=_env("RF_HEAD_IP"), port=PortBlock(int(_env("RF_BASE"))).tracking,
        store_dir=store, password_path=password_path, secret_key_path=secret_key_path,
        log_path=os.path.join(store, "mlflow.log")))


def metrics_config(target: str, store: str, days: int, size_mb: int, interval_s: int) -> int:
    """The head's Prometheus config (infra/node/metrics.py `PrometheusConfig`) in the head's
    private dir: the head's loopback at the block's Prometheus port, like the dashboard (only the
    head's dashboard and the cluster's tunnel read it, and Prometheus has no login of its own),
    Ray's discovery file in the head's Ray temp dir (autoscaled nodes appear by themselves), the
    database and log in `store` on the shared work dir (0700), bounded by the spec's
    metrics_history. Exit 1 with one line when the head has no `prometheus`."""
    if metrics.find_program() is None:
        print("rayfleet: metrics: no `prometheus` on the head's node (PATH, the env, "
              "/usr/bin); the cluster runs without metrics", file=sys.stderr)
        return 1
    return _daemon_config(target, store, metrics.PrometheusConfig(
        host="127.0.0.1", port=PortBlock(int(_env("RF_BASE"))).prometheus,
        discovery_file=os.path.join(_env("RF_HEAD_TEMP"), "ray", metrics.DISCOVERY_FILE),
        storage_dir=os.path.join(store, "tsdb"), retention_days=days,
        retention_size_mb=size_mb, scrape_interval_s=interval_s,
        log_path=os.path.join(store, "prometheus.log")))


def _daemon_config(target: str, store: str, config: Wire) -> int:
    """A head daemon's config (paths only, 0600) in the head's private dir, its store made on the
    shared work dir, 0700: the data is nobody else's."""
    os.makedirs(store, exist_ok=True)
    os.chmod(store, 0o700)
    config.write(target, mode=0o600)
    return 0


def leave_path() -> None:
    """Take the zip this module runs from (`rf_helper` put it first) off PYTHONPATH: the
    processes `ray start` spawns get the PYTHONPATH the job had."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if entries[0] and entries[0] == os.environ.get("RF_PY"):
        rest = os.pathsep.join(entries[1:])
        if rest:
            os.environ["PYTHONPATH"] = rest
        else:
            del os.environ["PYTHONPATH"]


def main(argv: list[str]) -> int:
    leave_path()
    command, args = argv[0], argv[1:]
    if command == "prepare":
        print(prepare(args[0], *(int(a) for a in args[1:4])))
        return 0
    if command == "block":
        print(node_block(int(args[0])))
        return 0
    if command == "autodown-config":
        return autodown_config(args[0], float(args[1]), args[2])
    if command == "tracking-config":
        return tracking_config(*args[:4])
    if command == "metrics-config":
        return metrics_config(args[0], args[1], *(int(a) for a in args[2:5]))
    if command == "stop":
        return stop(args)
    if command == "await":
        return await_ready(args[0], int(args[1]), float(args[2]), args[3:])
    if command == "start":
        return start(args)
    print(f"rayfleet helper: unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

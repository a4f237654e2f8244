"""GCP's autodown action (infra/node/autodown.py): the head deletes its workers, then its own VM.

Runs on the head with the credentials it already has for Ray's autoscaler (the VM's service account,
through the metadata server). Workers are chosen by exactly the labels teardown uses (`labels` in
the args), never by name alone; the head deletes itself last, so a failure half-way leaves a head
that can retry. Needs Google's client at run time (api.py imports it inside its calls): the GCP
node installer puts it in the head's env. infra/providers/gcp_tpu/services.py is the
laptop's side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.node import identity
from infra.node.gcp_tpu import queued
from infra.node.gcp_tpu.api import ApiOptions, Gcp, find_credentials
from infra.node.wait import until
from infra.node.where import ray_executable


def remove(args: dict[str, Any], log: Callable[[str], None]) -> None:
    """Delete TPU nodes and VMs carrying `labels` in `zone`, the head (`head_name`) last."""
    project, zone = str(args["project"]), str(args["zone"])
    labels = {str(k): str(v) for k, v in dict(args["labels"]).items()}
    head = str(args["head_name"])
    api = Gcp(project, find_credentials(args.get("credentials_file"), "the head's autodown"),
              ApiOptions(endpoint=args.get("api_endpoint") or None))
    wait_s = float(args.get("wait_s") or 900)
    operations = []
    # Queued TPU slices (queued.py): each request goes with its nodes (force), in every zone the
    # slices may use (`queued_zones`); chosen by the cluster id in their ids and node labels.
    cluster_id = labels.get(identity.TAG_CLUSTER, "")
    for queued_zone in ([str(z) for z in args.get("queued_zones") or []] if cluster_id else []):
        for request in queued.listed(api, queued_zone, cluster_id):
            log(f"deleting queued TPU request {queued.short(request)}")
            operations.append(queued.delete(api, str(request["name"])))
    for node in api.tpu_nodes(zone, labels):
        log(f"deleting TPU node {str(node['name']).rsplit('/', 1)[-1]}")
        operations.append(api.delete_tpu_node(str(node["name"])))
    for vm in api.instances(zone, labels):
        if vm["name"] != head and "tpu_cores" not in (vm.get("labels") or {}):
            log(f"deleting VM {vm['name']}")
            operations.append(api.delete_instance(zone, str(vm["name"])))
    pending = [operation for operation in operations if operation is not None]

    def all_deleted() -> bool:
        pending[:] = [o for o in pending if api.poll(o, "deleting a worker") is None]
        return not pending

    if pending:
        until(all_deleted, wait_s, api.options.poll_interval, "the workers to be deleted")
    log(f"deleting the head VM {head}")
    api.delete_instance(zone, head)


def stop_autoscaler(args: dict[str, Any], log: Callable[[str], None]) -> bool:
    """Stop Ray's separated autoscaler and its supervisor, by the supervisor's pid file
    (`monitor_pidfile`; by pid and start time, so a recycled pid is never signalled): stopped
    together, nothing starts the monitor again while the cluster goes. True when one ran."""
    from infra.node import supervise

    monitor = args.get("monitor_pidfile")
    if monitor and supervise.stop(Path(str(monitor)).expanduser()):
        log("stopped Ray's autoscaler on the head, so that it launches no more workers")
        return True
    return False


def stop_ray_then_remove(args: dict[str, Any], log: Callable[[str], None]) -> None:
    """The watcher's action on a GCP head: stop Ray's autoscaler here first, then `remove`.

    Ray's autoscaler keeps `min_workers` running: left alive, it would launch a replacement for
    every worker `remove` deletes, and that replacement would outlive the head. Stopped, nothing
    launches; a launch request already sent shows in the listing a moment later. The watcher runs
    as the autoscaler's user (`monitor_pidfile`: the monitor runs apart from Ray, issue 29, under
    the head's one supervisor), which can stop its own monitor and that supervisor
    (`stop_autoscaler`) but not Ray, another user's; a head from before runs its monitor inside
    Ray, so `ray stop` there.
    """
    import subprocess

    from infra.node import supervise

    for pid_file in [str(p) for p in args.get("stop_first") or []]:
        # The queued-slice joiner and its supervisor (by identity): stopped, it re-queues nothing
        # while its requests are deleted.
        if supervise.stop(Path(pid_file).expanduser()):
            log(f"stopped the head's daemon {pid_file}")
    if not stop_autoscaler(args, log):
        ray = ray_executable(default="")
        if not ray:
            remove(args, log)
            return
        log("stopping Ray on the head, so that its autoscaler launches no more workers")
        done = subprocess.run([ray, "stop"], capture_output=True, text=True, timeout=300,
                              check=False)
        if done.returncode != 0:
            log(f"`ray stop` exited {done.returncode}: {done.stderr.strip()[-200:]}")
    # A launch the autoscaler sent just before it stopped shows in the listing a moment later.
    time.sleep(float(args.get("settle_s", 3)))
    remove(args, log)

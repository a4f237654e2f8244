"""Scoped process matching: a cluster's markers never match another cluster's processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from infra.node import rayproc
from tests.waiting import wait_until


def test_temp_dir_marker_respects_boundaries() -> None:
    assert rayproc.contains("raylet --socket=/tmp/rayfleet/lab/session_1/s", "/tmp/rayfleet/lab")
    assert rayproc.contains("dashboard --temp-dir=/tmp/rayfleet/lab", "/tmp/rayfleet/lab")
    assert not rayproc.contains("raylet --socket=/tmp/rayfleet/lab2/s", "/tmp/rayfleet/lab")
    assert not rayproc.contains("raylet --socket=/tmp/rayfleet/lab-b/s", "/tmp/rayfleet/lab")
    # A hand-started Ray uses /tmp/ray: our marker must not match it, nor its marker ours.
    assert not rayproc.contains("raylet --socket=/tmp/ray/session_1/s", "/tmp/rayfleet/lab")
    assert not rayproc.contains("raylet --socket=/tmp/rayfleet/lab/s", "/tmp/ray")


def test_gcs_marker_matches_only_its_port() -> None:
    marker = rayproc.gcs_marker(21000)
    assert rayproc.contains("ray.util.client.server --address=192.0.2.2:21000 --x", marker)
    assert not rayproc.contains("--address=192.0.2.2:210001", marker)
    assert not rayproc.contains("--address=192.0.2.2:6379", marker)


def test_descendants_are_found_and_terminated() -> None:
    marker = "rayproc-test-marker-5f2c"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess,sys,time; subprocess.Popen(['sleep','60']); time.sleep(60)", marker])
    try:
        def both() -> list[int] | None:
            pids = rayproc.cluster_processes([marker])
            return pids if len(pids) == 2 else None

        found = wait_until(both, "the parent and its child `sleep`", timeout=10, interval=0.05)
        assert parent.pid in found and len(found) == 2, "the child `sleep` is found by ancestry"
        assert rayproc.terminate(found, grace=2) == []
        assert not any(rayproc.alive(p) for p in found)
    finally:
        parent.kill()
        parent.wait()


def test_port_block_flags_cover_every_ray_port() -> None:
    flags = rayproc.PortBlock(30000).flags()
    names = {f.split("=")[0] for f in flags}
    assert {"--port", "--dashboard-port", "--node-manager-port", "--object-manager-port",
            "--ray-client-server-port", "--min-worker-port", "--max-worker-port",
            "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
            "--metrics-export-port", "--runtime-env-agent-port"} == names
    ports = [int(f.split("=")[1]) for f in flags]
    assert min(ports) == 30000 and max(ports) < 30000 + rayproc.BLOCK_SIZE


def test_processes_in_other_network_namespaces_are_never_matched(needs_root: None) -> None:
    """Port 6379 in a container or test-bed host is another machine's Ray, not this cluster's."""
    import shutil
    import time

    def entered_or_failed() -> bool:
        try:
            return other.poll() is not None or (
                os.readlink(f"/proc/{other.pid}/ns/net") != os.readlink("/proc/self/ns/net"))
        except FileNotFoundError:  # it exited between the two looks
            return True

    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    marker = f"--gcs-address=10.200.99.1:6379 rayproc-test-{time.time_ns()}"
    other = subprocess.Popen(["unshare", "--net", "--", "bash", "-c", "sleep 30; true", "-", marker])
    try:
        # Until `unshare` is in its own network namespace (or has failed, unprivileged).
        wait_until(entered_or_failed, "unshare to enter a new network namespace", timeout=10,
                   interval=0.02)
        if other.poll() is not None:
            pytest.skip("cannot create a network namespace here (needs root)")
        found = rayproc.cluster_processes([rayproc.gcs_marker(6379)])
        assert not [p for p in found if marker in rayproc.cmdline(p)], found
    finally:
        other.kill()
        other.wait()

"""State files: atomic, locked, versioned, secret-free, and survive a kill -9 at any instant."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.core import state
from infra.core.errors import StateError, StateLockedError
from tests.waiting import wait_until


class Head(state.Attrs):
    """A resource kind of this test's own (shared code names no provider's)."""

    KIND = "ray-head"

    port_base: int | None = None


class Key(state.Attrs):
    KIND = "key"

    blob: str


def test_add_saves_immediately_and_round_trips(rf_home: Path) -> None:
    with state.locked("lab", "local", "up") as current:
        current.add("/tmp/rayfleet/lab", Head(port_base=21000))
        on_disk = json.loads(current.path.read_text())
    assert on_disk["version"] == state.VERSION
    assert on_disk["resources"] == [
        {"kind": "ray-head", "id": "/tmp/rayfleet/lab", "attrs": {"port_base": 21000}}
    ]
    loaded = state.read("lab")
    assert loaded is not None
    assert loaded.find(Head, "/tmp/rayfleet/lab") is not None


def test_second_run_is_told_who_holds_the_lock(rf_home: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from infra.core import state
            with state.locked("lab", "local", "up"):
                print("locked", flush=True)
                time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True, env={**os.environ},
        cwd=Path(__file__).parent.parent,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StateLockedError) as caught, state.locked("lab", "local", "teardown"):
            pass
        assert f"pid {holder.pid}" in str(caught.value)
        assert "`invoke up`" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
    # The lock dies with its holder: no stale lock after a crash.
    with state.locked("lab", "local", "teardown"):
        pass


def test_unknown_version_is_refused(rf_home: Path) -> None:
    path = state.state_path("lab")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 99, "cluster": "lab"}))
    with pytest.raises(StateError, match="version 99"):
        state.read("lab")


def test_torn_file_is_reported_not_ignored(rf_home: Path) -> None:
    path = state.state_path("lab")
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "resou')
    with pytest.raises(StateError, match="not valid JSON"):
        state.read("lab")


def test_key_material_is_never_written(rf_home: Path) -> None:
    with state.locked("lab", "local", "up") as current, pytest.raises(StateError):
        current.add("k1", Key(blob="-----BEGIN OPENSSH PRIVATE KEY-----"))
    assert state.read("lab") is None or "PRIVATE" not in state.state_path("lab").read_text()


def test_state_of_another_provider_is_not_reused(rf_home: Path) -> None:
    with state.locked("lab", "local", "up") as current:
        current.add("x", Head())
    with pytest.raises(StateError, match="belongs to a local cluster"), \
            state.locked("lab", "slurm", "up"):
        pass


def test_delete_refuses_while_resources_remain(rf_home: Path) -> None:
    with state.locked("lab", "local", "up") as current:
        current.add("x", Head())
        with pytest.raises(StateError, match="still lists ray-head"):
            current.delete()
        current.remove("ray-head", "x")
        current.delete()
    assert state.read("lab") is None


def test_kill_9_during_writes_never_leaves_a_torn_file(rf_home: Path) -> None:
    """A writer killed at a random instant leaves a parseable file listing a prefix of its adds."""
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            from infra.core import state

            class Thing(state.Attrs):
                KIND = "thing"
                payload: str

            with state.locked("lab", "local", "up") as current:
                for i in range(100000):
                    current.add(str(i), Thing(payload="x" * 2000))
        """)],
        env={**os.environ}, cwd=Path(__file__).parent.parent,
    )
    path = state.state_path("lab")
    wait_until(lambda: path.exists() and len(json.loads(path.read_text())["resources"]) > 20,
               "the writer to have saved some resources", timeout=30, interval=0.05)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    loaded = state.read("lab")
    assert loaded is not None
    ids = [int(r.id) for r in loaded.resources()]
    assert ids == list(range(len(ids))) and len(ids) > 20

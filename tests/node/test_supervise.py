"""The head daemons' supervisor (infra/node/supervise.py) and process identity by start time
(infra/node/rayproc.Identity), with real processes: a killed daemon comes back, a pid file naming
a stranger's pid never blocks a start, and a recycled pid is never signalled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.node import rayproc, supervise
from infra.node.rayproc import Identity
from tests.waiting import wait_until

DAEMON = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]


def _until(check: Callable[[], object], timeout: float, what: str) -> float:
    """Seconds until `check()` holds (tests/waiting.py's wait, at a short interval)."""
    started = time.monotonic()
    wait_until(lambda: check() or None, what, timeout=timeout, interval=0.05)
    return time.monotonic() - started


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not ours to supervise (what a recycled pid names)."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "daemon.json.pid"
    yield path
    supervise.stop(path)


def test_identity_is_pid_and_start_time(stranger: subprocess.Popen[bytes]) -> None:
    me = Identity.of(os.getpid())
    assert me is not None and me.running()
    assert Identity.from_dict(me.as_dict()) == me
    # The same pid, started at another time: another process (the kernel reused the pid).
    assert not Identity(stranger.pid, me.create_time - 1000).running()
    assert Identity.of(stranger.pid) is not None and Identity.of(stranger.pid).running()  # type: ignore[union-attr]
    # A bare pid (an older pid file) proves nothing.
    assert Identity.from_dict({"pid": stranger.pid}) is None
    assert Identity.from_dict(stranger.pid) is None
    assert Identity.of(2**22 + 12345) is None


def test_an_identity_taken_in_a_nested_pid_namespace_is_found_from_outside(
        needs_root: None) -> None:
    """A local Slurm head's node runs in a PID namespace of its own: `status` here must see the
    watcher whose pid file it wrote. A pid file of this namespace is looked up by its pid alone."""
    code = ("import json, os, time\nfrom infra.node.rayproc import Identity\n"
            "print(json.dumps(Identity.of(os.getpid()).as_dict()), flush=True)\ntime.sleep(60)")
    root = str(Path(__file__).resolve().parents[2])
    inner_proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                                   "-c", code], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": root})
    try:
        assert inner_proc.stdout is not None
        inner = Identity.from_dict(json.loads(inner_proc.stdout.readline()))
        here = Identity.of(os.getpid())
        assert inner is not None and here is not None
        assert inner.pid == 1 and inner.pidns != here.pidns, inner
        found = inner.process()
        assert found is not None and found.pid != 1 and "Identity.of" in " ".join(found.cmdline())
        # The same pair claimed for this namespace names no process here (our pid 1 started
        # earlier), and nothing else is searched for it.
        assert not Identity(inner.pid, inner.create_time, here.pidns).running()
    finally:
        inner_proc.kill()
        inner_proc.wait()


def test_terminate_never_signals_a_recycled_pid(stranger: subprocess.Popen[bytes]) -> None:
    real = Identity.of(stranger.pid)
    assert real is not None
    recycled = Identity(stranger.pid, real.create_time - 50)
    assert rayproc.terminate([recycled], grace=0.2) == []
    assert stranger.poll() is None, "a pid whose start time differs must never be signalled"
    assert rayproc.terminate([real], grace=2) == []
    assert stranger.wait(timeout=5) == -signal.SIGTERM


def test_a_killed_daemon_is_back_within_seconds(pidfile: Path, tmp_path: Path) -> None:
    assert supervise.ensure(DAEMON, pidfile, tmp_path / "log")
    assert not supervise.ensure(DAEMON, pidfile, tmp_path / "log"), "one runs already"
    _until(lambda: supervise.status(pidfile)["daemon_running"], 10, "the daemon")
    first = supervise.read(pidfile)["child"]
    os.kill(first.pid, signal.SIGKILL)
    took = _until(lambda: (supervise.read(pidfile)["child"] not in (None, first)
                           and supervise.status(pidfile)["daemon_running"]), 30,
                  "the daemon started again")
    print(f"daemon back {took:.1f}s after kill -9")
    assert took < 30
    # The supervisor stops with its daemon: nothing of either is left.
    second = supervise.read(pidfile)
    assert supervise.stop(pidfile)
    assert not second["supervisor"].running() and not second["child"].running()
    assert not pidfile.exists()


def test_a_daemon_that_finishes_is_not_restarted(pidfile: Path, tmp_path: Path) -> None:
    assert supervise.ensure([sys.executable, "-c", "pass"], pidfile, tmp_path / "log")
    _until(lambda: not supervise.running(pidfile), 10, "the supervisor to end")
    assert "finished (exit 0); not restarting" in (tmp_path / "log").read_text()


@pytest.mark.parametrize("style", ["identity", "bare pid"])
def test_a_pidfile_naming_another_process_never_blocks_a_start(
        pidfile: Path, tmp_path: Path, stranger: subprocess.Popen[bytes], style: str) -> None:
    real = Identity.of(stranger.pid)
    assert real is not None
    if style == "bare pid":  # what daemons wrote before identities
        pidfile.write_text(f"{stranger.pid}\n")
    else:  # the stranger holds the pid our supervisor and daemon once had
        gone = Identity(stranger.pid, real.create_time - 100).as_dict()
        pidfile.write_text(json.dumps({"supervisor": gone, "child": gone, "argv": DAEMON}))
    assert not supervise.running(pidfile)
    assert supervise.ensure(DAEMON, pidfile, tmp_path / "log")
    _until(lambda: supervise.status(pidfile)["daemon_running"], 10, "the daemon")
    assert supervise.read(pidfile)["child"].pid != stranger.pid
    supervise.stop(pidfile)
    assert stranger.poll() is None, "the stranger was signalled"


def test_a_new_supervisor_replaces_the_orphan_of_a_killed_one(pidfile: Path,
                                                              tmp_path: Path) -> None:
    supervise.ensure(DAEMON, pidfile, tmp_path / "log")
    _until(lambda: supervise.status(pidfile)["daemon_running"], 10, "the daemon")
    before = supervise.read(pidfile)
    os.kill(before["supervisor"].pid, signal.SIGKILL)
    _until(lambda: not before["supervisor"].running(), 10, "the supervisor to die")
    assert before["child"].running() and supervise.running(pidfile), \
        "the daemon guards on while nobody supervises it"
    assert not supervise.ensure(DAEMON, pidfile, tmp_path / "log"), "it still runs"
    child = before["child"].process()
    assert child is not None
    child.kill()
    _until(lambda: not supervise.running(pidfile), 10, "nothing running")
    assert supervise.status(pidfile) == {"running": False, "supervisor_running": False,
                                         "daemon_running": False, "pid": None}
    assert supervise.ensure(DAEMON, pidfile, tmp_path / "log")
    _until(lambda: supervise.status(pidfile)["daemon_running"], 10, "the daemon")

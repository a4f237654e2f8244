"""Issue 47, high: a gateway that ends unasked, exit 0 included, is started again by its
supervisor (before: exit 0 meant "finished", and the class was locked out until the owner's next
`up`). Real supervisors (infra/node/supervise.py) with a tiny daemon that exits 0 at once; and
`up`'s one start of the gateway asks for that policy on every head."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra.core.head import GatewayFiles
from infra.core.sharing import owner
from infra.node import gateway_config, supervise
from infra.node.rayproc import Identity
from tests.waiting import wait_until


def _exits_at_once(marker: Path) -> list[str]:
    """A daemon that notes each start in `marker`, then exits 0 (as `watch` did, sys.exit(0))."""
    return [sys.executable, "-c",
            f"open({str(marker)!r}, 'a').write('started\\n'); raise SystemExit(0)"]


def _starts(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "gateway.json.pid"
    yield path
    supervise.stop(path)


def test_a_daemon_that_exits_0_is_restarted_under_always_until_its_supervisor_is_stopped(
        tmp_path: Path, pidfile: Path) -> None:
    marker = tmp_path / "starts"
    run = subprocess.Popen([sys.executable, "-m", "infra.node.supervise", "run", "--pidfile",
                            str(pidfile), "--restart", "always", "--",
                            *_exits_at_once(marker)], stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _starts(marker) >= 3 or None, "three starts of a daemon that exits 0",
                   timeout=30, interval=0.1)
        assert run.poll() is None, "the supervisor ended"
    finally:
        run.terminate()  # SIGTERM to the supervisor: the one way to end a daemon under `always`
        out, _ = run.communicate(timeout=30)
    assert run.returncode == 0
    assert "daemon exited 0 unasked (restart: always): starting it again" in out, out
    starts = _starts(marker)
    assert not pidfile.exists()
    assert _starts(marker) == starts  # nothing started it again after the stop


def test_under_the_default_policy_exit_0_still_means_finished(tmp_path: Path,
                                                                 pidfile: Path) -> None:
    """The autodown watcher exits 0 once it removed the cluster: not started again."""
    marker = tmp_path / "starts"
    done = subprocess.run([sys.executable, "-m", "infra.node.supervise", "run", "--pidfile",
                           str(pidfile), "--", *_exits_at_once(marker)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "finished (exit 0); not restarting" in done.stdout
    assert _starts(marker) == 1


def test_ensure_passes_the_policy_to_the_detached_supervisor(tmp_path: Path,
                                                             pidfile: Path) -> None:
    marker = tmp_path / "starts"
    assert supervise.ensure(_exits_at_once(marker), pidfile, tmp_path / "log", restart="always")
    wait_until(lambda: _starts(marker) >= 2 or None, "a second start", timeout=30, interval=0.1)
    found = supervise.read(pidfile)["supervisor"]
    assert isinstance(found, Identity) and found.running()
    supervise.stop(pidfile)
    assert not found.running()
    with pytest.raises(ValueError, match="restart policy 'sometimes'"):
        supervise.ensure(["true"], pidfile, tmp_path / "log", restart="sometimes")


def test_up_starts_the_gateway_under_the_always_policy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`start_gateway`, the one place that starts a gateway, on any head (HeadAccess)."""
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "home"))
    owner.write_registry("class", {})
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("cert")
    key.write_text("key")
    asked: list[dict[str, Any]] = []

    def ensure_daemon(module: str, *_: Any, **kwargs: Any) -> bool:
        asked.append({"module": module, **kwargs})
        return True

    access = SimpleNamespace(
        gateway_files=lambda cluster: GatewayFiles("g/config.json", "g/data", "g/cert.pem",
                                                   "g/key.pem", "g/log"),
        head_path=lambda path: f"/head/{path}", ensure_daemon=ensure_daemon)
    config = gateway_config.Config(cluster="class", host="127.0.0.1", port=8443,
                                   upstream="http://127.0.0.1:8265", token_path=None,
                                   cert=str(cert), key=str(key), data_dir="g/data")
    owner.start_gateway(access, config, tmp_path / "config.json")  # type: ignore[arg-type]
    assert [(a["module"], a["restart"]) for a in asked] == [("infra.node.gateway", "always")]

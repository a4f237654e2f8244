"""The detached tunnel's record (infra/core/tunnels.py): typed, and a file an earlier rayfleet wrote
still reads. (Starting and reusing the tunnel: tests/lambda_cloud/test_access.py, on a real sshd.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from infra.core import tunnels
from infra.node import rayproc

#: A record as rayfleet wrote it before `Record` (39c8648), field for field.
TODAY = {"pid": 4242, "argv": ["ssh", "-N", "-L", "127.0.0.1:50001:127.0.0.1:8265", "root@10.0.0.2"],
         "target": "root@10.0.0.2:22", "create_time": 1764240000.25,
         "remote": {"dashboard": 8265, "client": 10001}, "local": {"dashboard": 50001, "client": 50002}}


def test_a_record_written_today_reads_as_a_record(rf_home: Path) -> None:
    path = tunnels.record_path("old")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(TODAY) + "\n")
    record = tunnels.read_record("old")
    assert record == tunnels.Record(pid=4242, argv=TODAY["argv"], target="root@10.0.0.2:22",
                                    create_time=1764240000.25,
                                    remote={"dashboard": 8265, "client": 10001},
                                    local={"dashboard": 50001, "client": 50002})


def test_a_broken_record_is_no_tunnel(rf_home: Path) -> None:
    path = tunnels.record_path("broken")
    path.parent.mkdir(parents=True, exist_ok=True)
    for text in ("not json", "[]", '{"pid": "x"}', json.dumps({**TODAY, "local": ["a"]})):
        path.write_text(text)
        assert tunnels.read_record("broken") is None, text
    assert tunnels.close("broken") is False and not path.exists()


def test_close_signals_only_the_recorded_process(rf_home: Path) -> None:
    """Another process on the recorded pid (another command line, or another start time) is
    never signalled; the recorded one is."""
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as proc:
        try:
            ident = rayproc.Identity.of(proc.pid)
            assert ident is not None
            path = tunnels.record_path("mine")
            path.parent.mkdir(parents=True, exist_ok=True)
            for stranger in ({"argv": ["ssh", "-N"]}, {"create_time": ident.create_time - 5}):
                path.write_text(json.dumps({**TODAY, "pid": proc.pid, "argv": proc.args,
                                            "create_time": ident.create_time, **stranger}))
                assert tunnels.close("mine") is False and proc.poll() is None
            path.write_text(json.dumps({**TODAY, "pid": proc.pid, "argv": proc.args,
                                        "create_time": ident.create_time}))
            assert tunnels.close("mine") is True
            assert proc.wait(timeout=10) is not None
        finally:
            proc.kill()

"""The head interface (infra/core/head.py) itself: `LocalHead` for real on temporary folders and
processes; `SharedFsHead` around it (what a Slurm head on this machine is); `SshHead`'s command
lines. The SSH implementation's files, daemons and tunnels are exercised on the test bed by the
e2e tests (tests/lambda_cloud/test_e2e_sharing_isolation.py, test_access.py, ...)."""

from __future__ import annotations

import os
import shlex
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import ssh
from infra.core.errors import RayfleetError
from infra.core.head import LocalHead, SharedFsHead
from infra.core.head_ssh import SshHead
from infra.node import supervise
from tests.waiting import wait_until

#: A node module stand-in for a head daemon: takes `--config`, says which config it runs with.
SLEEPER = '''import argparse, pathlib, time
p = argparse.ArgumentParser(); p.add_argument("--config")
a = p.parse_args()
print("running with", pathlib.Path(a.config).read_text(), flush=True)
while True:
    time.sleep(1)
'''


@pytest.fixture
def head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalHead:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "rf"))
    (tmp_path / "home").mkdir()
    return LocalHead(where="this machine", env={"RF_HEAD_TEST": "~/x"})


@pytest.fixture
def daemon_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """`rf_sleeper`, importable by the supervisor's child (PYTHONPATH is inherited)."""
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "rf_sleeper.py").write_text(SLEEPER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p))
    yield "rf_sleeper"


def test_run_is_a_shell_in_the_heads_environment(head: LocalHead, tmp_path: Path) -> None:
    done = head.run('printf %s "$RF_HEAD_TEST"; echo oops >&2; exit 3')
    assert (done.exit_code, done.stdout, done.stderr) == (3, f"{tmp_path}/home/x", "oops\n")
    assert head.run("true", check=True).ok
    with pytest.raises(RayfleetError, match="`false` on this machine exited 1"):
        head.run("false", check=True)


def test_put_private_writes_0600_files_whole_in_0700_folders(head: LocalHead,
                                                             tmp_path: Path) -> None:
    head.put_private({"~/a/b/secret": b"one", f"{tmp_path}/abs/other": b"two"})
    secret = tmp_path / "home" / "a" / "b" / "secret"
    assert secret.read_bytes() == b"one" and (tmp_path / "abs" / "other").read_bytes() == b"two"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    assert sorted(os.listdir(secret.parent)) == ["secret"]  # no temporary file left
    # The same bytes again: the file is left alone (it may be the very file a daemon reads).
    inode = secret.stat().st_ino
    head.put_private({"~/a/b/secret": b"one"})
    assert secret.stat().st_ino == inode
    head.put_private({"~/a/b/secret": b"new"})
    assert secret.read_bytes() == b"new" and secret.stat().st_ino != inode


def test_read_gives_none_for_a_missing_or_empty_file(head: LocalHead, tmp_path: Path) -> None:
    assert head.read("~/nothing") is None
    (tmp_path / "home" / "empty").write_text("")
    assert head.read("~/empty") is None
    (tmp_path / "home" / "marker").write_text("{}\n")
    assert head.read("~/marker") == "{}\n"


def test_the_local_head_needs_no_tunnel(head: LocalHead) -> None:
    with head.tunnel(8265) as port:
        assert port == 8265
    with head.tunnels([("127.0.0.1", 1), ("127.0.0.1", 2)]) as ports:
        assert ports == [1, 2]
    assert head.forward("c", {"dashboard": 8265}) == ({"dashboard": 8265}, None, False)


def test_answers_is_whether_the_port_accepts(head: LocalHead) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert head.answers(port, timeout=5)
    assert not head.answers(port, timeout=0.5)


def test_ensure_daemon_supervises_once_and_restarts_on_a_new_config(
        head: LocalHead, daemon_module: str, tmp_path: Path) -> None:
    config = "~/.rayfleet/sleeper.json"
    pidfile = tmp_path / "home" / ".rayfleet" / "sleeper.json.pid"
    try:
        assert head.ensure_daemon(daemon_module, config, '{"v": 1}',
                                  secrets={"~/.rayfleet/key": b"k"}, log="~/sleeper.log")
        assert (tmp_path / "home" / ".rayfleet" / "key").read_bytes() == b"k"
        assert stat.S_IMODE((tmp_path / "home" / ".rayfleet" / "sleeper.json").stat().st_mode) \
            == 0o600
        first = wait_until(lambda: supervise.read(pidfile)["child"], "the daemon", timeout=20)
        assert not head.ensure_daemon(daemon_module, config, '{"v": 1}')  # the same: kept
        assert supervise.read(pidfile)["child"] == first
        # replace=False: one that runs keeps the config it started with, another waits.
        assert not head.ensure_daemon(daemon_module, config, '{"v": 9}', replace=False)
        assert supervise.read(pidfile)["child"] == first and head.read(config) == '{"v": 1}'
        text, status = head.read_with_status(config, config)
        assert status is not None and status["running"] and text == '{"v": 1}'
        # Another config: started again with it.
        head.ensure_daemon(daemon_module, config, '{"v": 2}', log="~/sleeper.log")
        wait_until(lambda: (supervise.read(pidfile)["child"] or first) != first or None,
                   "the daemon with the new config", timeout=20)
        assert not first.running()
        wait_until(lambda: 'running with {"v": 2}' in (tmp_path / "home" / "sleeper.log")
                   .read_text() or None, "the new config's daemon", timeout=20)
    finally:
        head.stop_daemon(config)
    assert not supervise.running(pidfile)
    assert head.read_with_status("~/nothing", config)[1] == {
        "running": False, "supervisor_running": False, "daemon_running": False, "pid": None}


def test_run_node_and_fetch(head: LocalHead, tmp_path: Path) -> None:
    (tmp_path / "home" / "in.json").write_text('{"a":1}')
    done = head.run_node("json.tool", shlex.quote(str(tmp_path / "home" / "in.json")), check=True)
    assert done.stdout == '{\n    "a": 1\n}\n'
    head.fetch("~/in.json", tmp_path / "here.json")
    assert (tmp_path / "here.json").read_text() == '{"a":1}'
    assert not (tmp_path / "home" / "in.json").exists()  # a snapshot: gone from the head


def test_the_gateway_files_of_a_local_head_are_the_owners_own(head: LocalHead,
                                                             tmp_path: Path) -> None:
    files = head.gateway_files("c")
    assert files.data == str(tmp_path / "rf" / "sharing" / "c")
    assert files.config == str(tmp_path / "rf" / "sharing" / "c" / "rayfleet-gateway.json")
    assert head.head_path("~/x") == f"{tmp_path}/home/x"


def test_a_shared_fs_head_puts_the_config_last_and_starts_nothing(
        head: LocalHead, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = SharedFsHead(node=head, where=head.where, private_root=f"{tmp_path}/work/sharing/c")
    files = job.gateway_files("c")
    assert files.data == f"{tmp_path}/work/sharing/c/gateway" and job.head_path("~/a") == "a"
    assert (job.address, job.listen_host, job.node_users) == ("127.0.0.1", "127.0.0.1", False)
    seen: list[list[str]] = []
    original = head.put_private

    class Watching(LocalHead):
        def put_private(self, files: dict[str, bytes], user: str | None = None) -> None:
            seen.append(list(files))
            original(files, user)

    job = SharedFsHead(node=Watching(where="this machine"), where=head.where,
                       private_root=f"{tmp_path}/work/sharing/c")
    assert job.ensure_daemon("infra.node.gateway", files.config, '{"v": 1}',
                             secrets={files.cert: b"pem"})
    assert seen == [[files.cert, files.config]]
    assert Path(files.config).read_text() == '{"v": 1}'
    assert not supervise.running(Path(f"{files.config}.pid"))
    assert not job.ensure_daemon("infra.node.gateway", files.config, '{"v": 2}')
    assert "started it with the settings it had then" in capfd.readouterr().err
    job.ensure_daemon("infra.node.gateway", files.config, '{"v": 3}', replace=False)
    assert "settings" not in capfd.readouterr().err
    job.stop_daemon(files.config)  # the job's end ends it: nothing to do, nothing raised


def test_the_ssh_heads_command_lines(tmp_path: Path) -> None:
    target = ssh.SshTarget(host="192.0.2.7", user="ubuntu", key_path=tmp_path / "k")
    head = SshHead(target=target, where=str(target), env={"RAY_AUTH_TOKEN_PATH": "~/t"})
    argv = head.shell_argv("ray status")
    assert argv[0] == "ssh" and "ubuntu@192.0.2.7" in argv
    assert argv[-1] == 'export RAY_AUTH_TOKEN_PATH="$HOME"/t; ray status'
    assert (head.address, head.listen_host, head.node_users) == ("192.0.2.7", "0.0.0.0", True)
    assert head.head_path("~/.rayfleet/x") == ".rayfleet/x"
    with head.rsync_target() as (options, prefix):
        assert head.rsync_argv("down", "here/", "there/", options, prefix) == [
            "rsync", "-az", *options, "192.0.2.7:there/", "here/"]
        assert options[0] == "-e" and options[1].startswith("ssh -F ")
    with pytest.raises(RayfleetError, match="sync sideways"):
        head.rsync_argv("sideways", "a", "b", [], "")  # type: ignore[arg-type]

"""Writes that cannot be left half done: a full disk, a read-only file system (a real tmpfs of
64 KiB mounted as RAYFLEET_HOME; needs root, as CI has).

With the disk full, `invoke up` fails at the cluster's Ray token with one line naming the file and
the fix, exit != 0, and leaves no empty token behind (it used to leave an empty 0600 one that broke
every later `up`). A token left empty by an older version is replaced by the next `up`. The part of
`up` after the token (starting Ray) is tested elsewhere: here the token and the state are written
through the same code `up` runs, without starting Ray, to keep this fast.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import auth, state
from infra.core.errors import WriteError
from infra.node.files import atomic_write
from tests.conftest import run_invoke


@pytest.fixture
def tiny_home(needs_root: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    home = tmp_path / "tiny-home"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(home)],
                   check=True)
    monkeypatch.setenv("RAYFLEET_HOME", str(home))
    try:
        yield home
    finally:
        subprocess.run(["umount", str(home)], check=False)


def _fill(home: Path) -> Path:
    filler = home / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 1024)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def test_full_disk_up_is_one_line_and_leaves_no_empty_token(tiny_home: Path,
                                                            tmp_path: Path) -> None:
    spec = tmp_path / "full.yaml"
    spec.write_text("provider: local\n")
    filler = _fill(tiny_home)
    up = run_invoke("up", "--cluster", str(spec), env={"RAYFLEET_HOME": str(tiny_home)})
    assert up.returncode != 0
    lines = [line for line in up.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in up.stderr, up.stderr
    token = tiny_home / "keys" / "full" / "ray-token"
    assert str(token) in lines[0] and "disk is full" in lines[0], lines[0]
    assert not token.exists()
    leftovers = [p.name for p in tiny_home.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []

    # Space again, and an empty token as the old failure left it: the next `up` replaces it.
    filler.unlink()
    token.parent.mkdir(parents=True, exist_ok=True)
    token.touch(mode=0o600)
    with state.locked("full", "local", "up") as current:
        path = auth.ensure_token(current)
    assert path == token and oct(token.stat().st_mode & 0o777) == "0o600"
    assert len(token.read_text()) == 64 and int(token.read_text(), 16) >= 0
    saved = json.loads(state.state_path("full").read_text())
    assert saved["info"]["auth_token_path"] == str(token)
    # A good token is kept (a running cluster uses it).
    kept = token.read_text()
    with state.locked("full", "local", "up") as current:
        auth.ensure_token(current)
    assert token.read_text() == kept


def test_read_only_file_system_is_one_line_and_the_old_file_stays(tiny_home: Path) -> None:
    target = tiny_home / "state" / "c.json"
    atomic_write(target, "old\n")
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_home)], check=True)
    with pytest.raises(WriteError) as caught:
        atomic_write(target, "new\n")
    message = str(caught.value)
    assert "\n" not in message and str(target) in message and "read-only" in message, message
    assert target.read_text() == "old\n"


def test_full_disk_keeps_the_old_file_whole(tiny_home: Path) -> None:
    target = tiny_home / "state" / "c.json"
    atomic_write(target, "old\n", mode=0o600)
    _fill(tiny_home)
    with pytest.raises(WriteError, match="disk is full"):
        atomic_write(target, "x" * 200_000)
    assert target.read_text() == "old\n" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in target.parent.iterdir()) == ["c.json"]

"""File modes of the one atomic write: the umask decides unless the caller names a mode on purpose."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.node.files import atomic_file, atomic_write


@pytest.fixture
def umask_077() -> Iterator[None]:
    """A restrictive umask (a user who keeps everything private), restored afterwards."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_plain_file_is_never_more_open_than_the_umask_allows(tmp_path: Path, umask_077: None) -> None:
    atomic_write(tmp_path / "state.json", "{}\n")
    with atomic_file(tmp_path / "store.tar") as handle:
        handle.write(b"tar")
    assert _mode(tmp_path / "state.json") == 0o600
    assert _mode(tmp_path / "store.tar") == 0o600


def test_a_plain_file_follows_a_permissive_umask_too(tmp_path: Path) -> None:
    old = os.umask(0o002)  # a shared Slurm work dir's group-writable policy
    try:
        atomic_write(tmp_path / "info.json", "{}\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "info.json") == 0o664


def test_a_secret_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        atomic_write(tmp_path / "token", "secret", mode=0o600)
        # Replacing a file that was left world-readable narrows it too.
        (tmp_path / "key").write_text("old")
        (tmp_path / "key").chmod(0o644)
        atomic_write(tmp_path / "key", "new", mode=0o600)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "token") == 0o600
    assert _mode(tmp_path / "key") == 0o600 and (tmp_path / "key").read_text() == "new"

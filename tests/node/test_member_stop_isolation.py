"""A member cluster's stop ends its user's processes on this machine only: the test bed's hosts
share this kernel's process table, and one of their users can have the member user's uid."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator

import pytest

from infra.node import member_starter
from infra.node.member_clusters import member_user
from tests.waiting import wait_until

MEMBER = "stoptest0001"


@pytest.fixture
def user(needs_root: None) -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root: makes a system user")
    name = member_user(MEMBER)
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def _sleep_as(user: pwd.struct_passwd, *prefix: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*prefix, "setpriv", f"--reuid={user.pw_uid}",
                             f"--regid={user.pw_gid}", "--clear-groups", "sleep", "300"])


def test_stop_ends_the_members_processes_here_and_none_of_another_namespaces(
        user: pwd.struct_passwd) -> None:
    here = _sleep_as(user)
    # Another "machine": a process with the same uid in a network namespace of its own.
    elsewhere = _sleep_as(user, "unshare", "--net", "--")
    try:
        wait_until(lambda: os.stat(f"/proc/{elsewhere.pid}").st_uid == user.pw_uid
                   and os.stat(f"/proc/{here.pid}").st_uid == user.pw_uid,
                   "both sleeps run as the member's user", timeout=10, interval=0.05)
        assert member_starter.stop(MEMBER, grace_s=5) == 1
        assert here.wait(timeout=10) is not None
        assert elsewhere.poll() is None, "a process of another network namespace was ended"
    finally:
        for proc in (here, elsewhere):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

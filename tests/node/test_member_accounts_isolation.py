"""The member starter's account changes while another process holds the account files' lock.

useradd and userdel give up at once ("cannot lock /etc/passwd") while any other process changes
an account; in CI a removed member's user stayed behind that way while other tests made users.
Run as root in a private node (tests/test_privilege_users.py's: /etc copy-on-write, the users
made there vanish with it); seconds, no Ray."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests.test_privilege_users import in_private_node

pytestmark = [pytest.mark.usefixtures("needs_root"),
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare")
                                 or not shutil.which("useradd"),
                                 reason="needs root, unshare and useradd (CI runs as root)")]

MEMBER = "0a1b2c3d"
REMOVE = f"""
import sys
from infra.node import member_starter as ms
from infra.node.member_clusters import StarterConfig
root = sys.argv[1]
config = StarterConfig(cluster="acc", tmp_root=root, token_dir=root + "/tokens", gateway_uid=0,
                       gateway_gid=0, python_bin="")
ms.remove(config, "{MEMBER}")
"""


def test_a_removal_while_another_process_holds_the_account_lock_still_removes_the_user(
        tmp_path: Path) -> None:
    user = f"rf-m-{MEMBER}"
    # The holder takes the lock as shadow's tools do (its live PID in /etc/passwd.lock) and lets
    # go a second later: another account change on the machine, in the middle of the removal.
    script = (f"useradd --system --create-home --home-dir /home/{user} {user}; "
              "sleep 60 & holder=$!; printf %s $holder > /etc/passwd.lock; "
              "(sleep 1; rm -f /etc/passwd.lock; kill $holder) & "
              f"cd {shlex.quote(str(Path(__file__).resolve().parents[2]))} && "
              f"{shlex.quote(sys.executable)} -c {shlex.quote(REMOVE)} {shlex.quote(str(tmp_path))}"
              f"; echo removal=$?; getent passwd {user} >/dev/null && echo left || echo gone; wait")
    done = in_private_node(tmp_path, script)
    assert "removal=0" in done.stdout, done.stdout + done.stderr
    assert "gone" in done.stdout.split(), done.stdout + done.stderr

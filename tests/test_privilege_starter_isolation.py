"""`sharing.isolation: cluster` on a head set up over SSH (Lambda, GCP-TPU): what `up` sends
(infra/core/sharing/isolation.py's install_on_head) and what setup/users/users.sh then installs as
root, for real, in a private node (tests/test_privilege_users.py's: /etc and /home copy-on-write,
the users made there vanish with it). Needs root; seconds, no Ray."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from infra.cli import loading
from infra.core import privilege, ssh
from infra.core.head import HeadAccess
from infra.core.sharing import isolation
from infra.node import gateway_config
from tests.test_privilege_users import in_private_node

pytestmark = [pytest.mark.usefixtures("needs_root"),
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare")
                                 or not shutil.which("sudo"),
                                 reason="needs root, unshare and sudo (CI runs as root)")]

LAMBDA = {"provider": "lambda", "head": {"choices": [{"instance_type": "gpu_1x_a10",
                                                     "region": "us-east-1"}]},
          "workers": {"count": 0}, "autodown": {"idle_minutes": 10}, "metrics": "none",
          "sharing": {"allowed_source_ranges": ["198.51.100.0/24"], "isolation": "cluster"}}
GATEWAY, RAY = privilege.GATEWAY_USER, privilege.RAY_USER
GATEWAY_CONFIG = gateway_config.Config(
    cluster="iso", host="0.0.0.0", port=8443, upstream="http://127.0.0.1:8265",
    token_path=".rayfleet/ray-token", cert="c", key="k", data_dir=".rayfleet/gateway")


class SftpHome:
    """The parts of a remote head install_on_head uses: its files land in `home` as SFTP would
    leave them (0600), its command is kept to be run in the private node."""

    node_users = True

    def __init__(self, home: Path) -> None:
        self.home = home
        # The head's node environment: where `ray` is found (this test's own).
        self.activate = f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH && "
        self.commands: list[str] = []

    def head_path(self, path: str) -> str:
        return path.removeprefix("~/")

    def put_private(self, files: dict[str, bytes], user: str | None = None) -> None:
        assert user is None  # the SSH user's: users.sh hands them over as root
        for path, data in files.items():
            target = self.home / path.removeprefix("~/")
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o600)

    def run(self, command: str, timeout: float = 60.0, check: bool = False) -> ssh.Result:
        self.commands.append(command)
        return ssh.Result(0, "", "")


def test_up_installs_the_starter_as_roots_command_that_only_the_gateways_user_may_sudo(
        tmp_path: Path) -> None:
    selected = loading.parse_spec(Path("clusters/iso.yaml"), LAMBDA)
    home = tmp_path / "ssh-home"
    (home / privilege.USERS_DIR).mkdir(parents=True)
    head = SftpHome(home)
    config = isolation.with_member_clusters(
        selected, cast(HeadAccess, head), GATEWAY_CONFIG, tmp_path / "here")
    # The gateway reads its own copy, from its home; nothing was written on this machine.
    assert config.isolation == "cluster" and config.member_clusters_config == \
        isolation.GATEWAY_COPY and not (tmp_path / "here").exists()
    staged: dict[str, Any] = json.loads((home / isolation.STAGED / "member-starter.json").read_text())
    assert staged["command"] == list(isolation.STARTER_COMMAND) and staged["gateway_user"] == GATEWAY
    assert staged["python_bin"] == "" and staged["num_cpus"] == 0  # the head's, read there
    starter = isolation.STARTER_COMMAND[-1]
    [install] = head.commands
    checks = (
        f"stat -c '%U %a %n' {starter} /etc/rayfleet/member-starter.json "
        f"/etc/rayfleet/member-starter.zip /etc/sudoers.d/rayfleet-member-starter "
        f"/home/{GATEWAY}/{isolation.GATEWAY_COPY}; "
        f"test -e {shlex.quote(str(home / isolation.STAGED))} && echo STAGED-LEFT; "
        f"echo RULES $(runuser -u {GATEWAY} -- sudo -n -l | grep -c NOPASSWD); "
        f"runuser -u {GATEWAY} -- sudo -n {starter} stop 0123456789abcdef; "
        f"runuser -u {GATEWAY} -- sudo -n true 2>/dev/null || echo GATEWAY-NO-OTHER-SUDO; "
        f"runuser -u {RAY} -- sudo -n {starter} stop 0123456789abcdef 2>/dev/null "
        "|| echo RAY-NO-SUDO; "
        f"runuser -u {GATEWAY} -- cat /etc/rayfleet/member-starter.json 2>/dev/null "
        "|| echo CONFIG-ROOTS")
    # Twice: `up` of a running head installs it again.
    done = in_private_node(tmp_path, f"{install} && {install.replace(str(home), str(home))}"
                                     f" ; {checks}")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:5] == [f"root 755 {starter}", "root 600 /etc/rayfleet/member-starter.json",
                         "root 644 /etc/rayfleet/member-starter.zip",
                         "root 440 /etc/sudoers.d/rayfleet-member-starter",
                         f"{GATEWAY} 600 /home/{GATEWAY}/{isolation.GATEWAY_COPY}"], lines
    assert "STAGED-LEFT" not in lines and "RULES 1" in lines, lines
    # The starter ran as root with root's config: the member has no user here, nothing stopped.
    assert '{"stopped": 0}' in lines, lines
    assert {"GATEWAY-NO-OTHER-SUDO", "RAY-NO-SUDO", "CONFIG-ROOTS"} <= set(lines), lines

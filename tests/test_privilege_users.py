"""setup/users/users.sh and infra/privilege.py's commands for real, in a private mount namespace whose
/etc and /home are copy-on-write layers over this machine's (as every test-bed host has): the users
are made there and vanish with it. Needs root (useradd, mounts); seconds, no daemons."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from infra import paths, privilege

pytestmark = [pytest.mark.usefixtures("needs_root"),
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="needs root and unshare (CI runs as root)")]


def in_private_node(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run bash `script` as root in a new mount namespace with private /etc and /home; the SSH
    user's home is `tmp_path/ssh-home`, holding rayfleet's files as SFTP would leave them."""
    layers = tmp_path / "layers"
    mounts = []
    for tree in ("etc", "home"):
        upper, work = layers / f"{tree}-upper", layers / f"{tree}-work"
        mounts.append(f"mkdir -p {upper} {work} && chmod 0755 {upper} && mount -t overlay overlay "
                      f"-o lowerdir=/{tree},upperdir={upper},workdir={work} /{tree}")
    layers.mkdir()
    prelude = f"set -e; mount -t tmpfs -o mode=0700 tmpfs {layers}; " + "; ".join(mounts) + "; "
    # Its own PID namespace too, as a host's: `pgrep` there sees only the node's processes.
    return subprocess.run(["unshare", "--mount", "--pid", "--mount-proc", "--fork", "--", "bash",
                           "-c", prelude + script],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HOME": str(tmp_path / "ssh-home")})


def test_users_get_their_files_and_no_root_group(tmp_path: Path) -> None:
    home = tmp_path / "ssh-home"
    (home / ".rayfleet").mkdir(parents=True)
    (home / ".rayfleet" / "ray-token").write_text("TOKEN")
    (home / ".rayfleet" / "ray-token").chmod(0o600)
    (home / ".rayfleet" / "lambda-api-key").write_text("KEY")
    (home / ".rayfleet" / "lambda-api-key").chmod(0o600)
    (home / privilege.USERS_DIR).mkdir(parents=True)
    shutil.copy(paths.setup_dir() / "users" / "users.sh", home / privilege.USERS_SCRIPT)
    # The API key moves: once handed over, the autoscaler's user's copy is the only one.
    setup = privilege.setup_users([".rayfleet/ray-token", ".rayfleet/absent"],
                                  [".rayfleet/lambda-api-key", ".rayfleet/ray-token"],
                                  [".rayfleet/lambda-api-key"])
    # An image whose same-named user was in `sudo` already: setup takes it out again.
    script = (f"groupadd -f sudo; useradd --system -G sudo {privilege.RAY_USER}; "
              f"{setup} && {setup} && "  # idempotent: Ray re-runs start commands
              f"stat -c '%U %a %n' /home/{privilege.RAY_USER} /home/{privilege.SCALER_USER} "
              f"/home/{privilege.RAY_USER}/.rayfleet/ray-token "
              f"/home/{privilege.SCALER_USER}/.rayfleet/lambda-api-key; "
              f"echo groups $(id -Gn {privilege.RAY_USER}); "
              'ls "$HOME/.rayfleet" | tr "\\n" " " | sed "s/^/ssh-user-has /"; echo; '
              # `ray stop` only where Ray's user runs something (its `activate` prints here).
              f"{privilege.stop_ray('echo stop-tried && ')} && echo stop-done; "
              f"runuser -u {privilege.RAY_USER} -- sleep 30 & sleep 0.3; "
              f"{privilege.stop_ray('echo stop-tried && ')} && echo stop-done; kill %1; "
              + privilege.as_user(privilege.RAY_USER,
                                  f"cat /home/{privilege.SCALER_USER}/.rayfleet/lambda-api-key "
                                  "|| echo REFUSED; sudo -n true 2>/dev/null || echo NO-SUDO; "
                                  'echo "head=$RAY_HEAD_IP home=$HOME"'))
    done = in_private_node(tmp_path, f"export RAY_HEAD_IP=10.1.2.3; {script}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    ray, scaler = privilege.RAY_USER, privilege.SCALER_USER
    assert lines[:4] == [f"{ray} 700 /home/{ray}", f"{scaler} 700 /home/{scaler}",
                         f"{ray} 600 /home/{ray}/.rayfleet/ray-token",
                         f"{scaler} 600 /home/{scaler}/.rayfleet/lambda-api-key"], lines
    assert lines[4] == f"groups {ray}", lines
    assert lines[5] == "ssh-user-has ray-token ", lines
    assert lines[6:9] == ["stop-done", "stop-tried", "stop-done"], lines
    assert "KEY" not in lines[5:] and "REFUSED" in lines and "NO-SUDO" in lines, lines
    assert f"head=10.1.2.3 home=/home/{ray}" in lines, lines
    # The namespace is gone, and the users with it.
    here = subprocess.run(["getent", "passwd", ray, scaler], capture_output=True)
    assert here.returncode != 0


def test_users_sh_refuses_a_non_root_caller(tmp_path: Path) -> None:
    script = shlex.quote(str(paths.setup_dir() / "users" / "users.sh"))
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash",
                           "-c", f"bash {script} /tmp"], capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "run as root" in done.stderr, done.stderr

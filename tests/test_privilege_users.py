"""setup/users/users.sh and infra/core/privilege.py's commands for real, in a private mount namespace whose
/etc and /home are copy-on-write layers over this machine's (as every test-bed host has): the users
are made there and vanish with it. Needs root (useradd, mounts); seconds, no daemons."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.core import paths, privilege

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
    shutil.copy(paths.setup_dir() / "users" / "ray.sh", home / privilege.RAY_SCRIPT)
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


def test_the_gateways_user_has_no_sudo_no_shell_no_key_and_a_private_home(tmp_path: Path) -> None:
    """rayfleet-gateway (issue 35): its files in 0700 folders of its own home, where Ray's user
    (every job) cannot look; a members file replaced while it is read is never missing; the SSH
    user's copy of a moved file is gone, of a copied one (the Ray token) kept."""
    home = tmp_path / "ssh-home"
    (home / ".rayfleet" / "gateway").mkdir(parents=True)
    for name, text in ((".rayfleet/ray-token", "TOKEN"), (".rayfleet/gateway.key", "KEY"),
                       (".rayfleet/gateway/members.json", '{"members": {}}')):
        (home / name).write_text(text)
        (home / name).chmod(0o600)
    (home / privilege.USERS_DIR).mkdir(parents=True)
    shutil.copy(paths.setup_dir() / "users" / "users.sh", home / privilege.USERS_SCRIPT)
    gw, ray = privilege.GATEWAY_USER, privilege.RAY_USER
    moved = [".rayfleet/gateway.key", ".rayfleet/gateway/members.json"]
    hand = privilege.hand_over(gw, [*moved, ".rayfleet/ray-token"], moved)
    again = privilege.hand_over(gw, [".rayfleet/gateway/members.json"],
                                [".rayfleet/gateway/members.json"])
    script = "; ".join([
        "set -e", privilege.setup_users([".rayfleet/ray-token"]), hand,
        # An image's same-named user with a shell, an SSH key and sudo: setup takes them away.
        f"usermod -s /bin/bash -aG sudo {gw} 2>/dev/null || (groupadd -f sudo && usermod -aG sudo {gw})",
        f"mkdir -p /home/{gw}/.ssh && echo key > /home/{gw}/.ssh/authorized_keys",
        "cp -p $HOME/.rayfleet/ray-token $HOME/.rayfleet/gateway.key",
        hand,
        f"stat -c '%U %a %n' /home/{gw} /home/{gw}/.rayfleet /home/{gw}/.rayfleet/gateway "
        f"/home/{gw}/.rayfleet/gateway/members.json /home/{gw}/.rayfleet/gateway.key "
        f"/home/{gw}/.rayfleet/ray-token",
        f"echo shell $(getent passwd {gw} | cut -d: -f7)",
        f"echo groups $(id -Gn {gw})",
        f"echo ssh $(ls -A /home/{gw} | grep -c '^.ssh$' || true)",
        'echo ssh-user-has $(ls "$HOME/.rayfleet" | tr "\\n" " ")',
        f"runuser -u {gw} -- sudo -n true 2>/dev/null && echo GW-SUDO || echo gw-no-sudo",
        f"runuser -u {ray} -- cat /home/{gw}/.rayfleet/gateway/members.json 2>/dev/null "
        "&& echo RAY-READ || echo ray-refused",
        f"runuser -u {ray} -- ls /home/{gw}/.rayfleet 2>/dev/null && echo RAY-LIST || echo ray-no-list",
        # The members file replaced 20 times while its user reads it in a loop: never missing.
        f"runuser -u {gw} -- bash -c 'while :; do [ -s ~/.rayfleet/gateway/members.json ] "
        "|| echo MISSING; done' > $HOME/watch.out 2>&1 & w=$!",
        *[f"echo '{{\"members\": {{\"m{i}\": {{}}}}}}' > $HOME/.rayfleet/gateway/members.json && "
          f"chmod 600 $HOME/.rayfleet/gateway/members.json && {again}" for i in range(20)],
        "kill $w; wait $w 2>/dev/null || true",
        "echo missing $(grep -c MISSING $HOME/watch.out || true)",
        f"echo members $(cat /home/{gw}/.rayfleet/gateway/members.json)",
    ])
    done = in_private_node(tmp_path, script)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:6] == [f"{gw} 700 /home/{gw}", f"{gw} 700 /home/{gw}/.rayfleet",
                         f"{gw} 700 /home/{gw}/.rayfleet/gateway",
                         f"{gw} 600 /home/{gw}/.rayfleet/gateway/members.json",
                         f"{gw} 600 /home/{gw}/.rayfleet/gateway.key",
                         f"{gw} 600 /home/{gw}/.rayfleet/ray-token"], lines
    assert "shell /usr/sbin/nologin" in lines and f"groups {gw}" in lines, lines
    assert "ssh 0" in lines, lines
    # The key and the members file left the SSH user's home; its token stays (Ray needs it).
    assert "ssh-user-has gateway ray-token" in [" ".join(x.split()) for x in lines], lines
    assert {"gw-no-sudo", "ray-refused", "ray-no-list", "missing 0"} <= set(lines), lines
    assert 'members {"members": {"m19": {}}}' in lines, lines


def test_a_user_that_swapped_a_folder_for_a_symlink_cannot_turn_setup_onto_another_file(
        tmp_path: Path) -> None:
    """users.sh runs again at every `up` (Ray re-runs start commands) while jobs have run as Ray's
    user, who owns its home: a `~/.rayfleet` made a symlink to a root-owned folder must not make
    root write there or hand that folder to the user."""
    home = tmp_path / "ssh-home"
    (home / ".rayfleet").mkdir(parents=True)
    (home / ".rayfleet" / "ray-token").write_text("TOKEN")
    (home / ".rayfleet" / "ray-token").chmod(0o600)
    (home / privilege.USERS_DIR).mkdir(parents=True)
    shutil.copy(paths.setup_dir() / "users" / "users.sh", home / privilege.USERS_SCRIPT)
    ray = privilege.RAY_USER
    setup = privilege.setup_users([".rayfleet/ray-token"])
    script = "; ".join([
        "set -e", setup, "mkdir -p /etc/rayfleet-victim && chmod 755 /etc/rayfleet-victim",
        # What a job could do as Ray's user: its own folder swapped for a link to root's.
        f"runuser -u {ray} -- bash -c 'cd ~ && mv .rayfleet .old && ln -s /etc/rayfleet-victim "
        ".rayfleet'",
        f"{setup} || echo setup-failed",
        "stat -c '%U %a' /etc/rayfleet-victim",
        "ls -A /etc/rayfleet-victim | tr '\\n' ' '; echo listed",
    ])
    done = in_private_node(tmp_path, script)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # Still root's, and empty: the setup refused (the user's own home is the user's problem).
    assert lines[-2:] == ["root 755", "listed"], lines

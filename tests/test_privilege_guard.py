"""setup/users/guard.sh for real: in a private network namespace (its own nftables) and mount
namespace (private /etc and /home, where users.sh makes the node's users), only root and the
autoscaler's user open connections to a guarded address; Ray's user and the SSH user who ran it
through sudo get a refused connection, and servers of Ray's user still answer a guarded address.
Needs root (unshare, nft, useradd); seconds, no daemons beyond two short-lived HTTP servers."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.core import paths, privilege
from tests.test_privilege_users import in_private_node

pytestmark = [pytest.mark.usefixtures("needs_root"),
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="needs root and unshare (CI runs as root)")]

#: A client that prints how a connection to (host, port) from (source) ended.
CONNECT = """
import json, socket, sys
host, port, source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    s = socket.create_connection((host, port), 5, (source, 0) if source else None)
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    print(json.dumps(s.recv(12).decode()))
except OSError as exc:
    print(json.dumps(type(exc).__name__))
"""


def test_only_root_and_the_autoscaler_reach_a_guarded_address(
        tmp_path: Path) -> None:
    home = tmp_path / "ssh-home"
    (home / privilege.USERS_DIR).mkdir(parents=True)
    for script in ("users.sh", "guard.sh"):
        shutil.copy(paths.setup_dir() / "users" / script, home / privilege.USERS_DIR / script)
    (home / "scaler-file").write_text("x")

    def connect(user: str, target: str, source: str = "") -> str:
        run = f"python3 -c {shlex.quote(CONNECT)} {target} 8080 {shlex.quote(source)}"
        return run if user == "root" else f"runuser -u {user} -- {run}"

    script = "; ".join([
        "set -e", "ip link set lo up", "ip addr add 127.0.0.5/8 dev lo 2>/dev/null || true",
        # The server's name as a node's resolver would answer it (its own /etc/hosts here).
        "echo '127.0.0.6 metadata.test' >> /etc/hosts",
        privilege.setup_users([], ["scaler-file"]),
        # Run twice (start commands re-run), the second time as the SSH user `nobody` through
        # sudo: the caller gets no exception (what of ours needs the server runs as the scaler).
        privilege.guard("127.0.0.5", "metadata.test"),
        f"SUDO_UID=$(id -u nobody) bash $HOME/{privilege.GUARD_SCRIPT} 127.0.0.5 metadata.test",
        "python3 -m http.server 8080 --directory / --bind 127.0.0.5 >/dev/null 2>&1 & a=$!",
        "python3 -m http.server 8080 --directory / --bind 127.0.0.6 >/dev/null 2>&1 & b=$!",
        # Ray's user serving on another address: the guarded address connects to it.
        f"runuser -u {privilege.RAY_USER} -- python3 -m http.server 8080 --directory / --bind 127.0.0.7 "
        ">/dev/null 2>&1 & c=$!",
        # Each server accepts (root may connect anywhere); a loaded machine starts them slowly.
        *[f"for i in $(seq 300); do (exec 3<>/dev/tcp/{ip}/8080) 2>/dev/null && break; "
          "sleep 0.1; done" for ip in ("127.0.0.5", "127.0.0.6", "127.0.0.7")],
        "set +e",
        *[f"echo {user}-{target} $({connect(user, target)})"
          for user in ("root", privilege.SCALER_USER, "nobody", privilege.RAY_USER)
          for target in ("127.0.0.5", "127.0.0.6")],
        f"echo reply $({connect('root', '127.0.0.7', '127.0.0.5')})",
        "nft list table inet rayfleet_guard | grep -c reject",
        "kill $a $b $c",
    ])
    done = in_private_node(tmp_path, f"unshare --net bash -c {shlex.quote(script)}")
    assert done.returncode == 0, done.stdout + done.stderr
    answers = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    http = json.dumps("HTTP/1.0 200")
    for target in ("127.0.0.5", "127.0.0.6"):
        assert answers[f"root-{target}"] == http, answers
        assert answers[f"{privilege.SCALER_USER}-{target}"] == http, answers
        for refused in ("nobody", privilege.RAY_USER):
            assert answers[f"{refused}-{target}"] == '"ConnectionRefusedError"', answers
    assert answers["reply"] == http, answers
    # One table, replaced on the re-run: two rules (TCP reset, the rest) for IPv4.
    assert done.stdout.splitlines()[-1] == "2", done.stdout


def test_guard_sh_refuses_a_non_root_caller_and_no_address(tmp_path: Path) -> None:
    script = paths.setup_dir() / "users" / "guard.sh"
    done = subprocess.run(["runuser", "-u", "nobody", "--", "bash", str(script), "127.0.0.5"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1 and "run as root" in done.stderr, done.stderr
    done = subprocess.run(["unshare", "--net", "bash", str(script), "no-such-name.invalid"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1, done.stderr
    assert "none of no-such-name.invalid has an address here" in done.stderr, done.stderr


def test_the_gcp_metadata_guard_covers_the_servers_ipv6_address_too(tmp_path: Path) -> None:
    """Google's metadata server answers at fd20:ce::254 besides 169.254.169.254 (dual-stack
    subnets) and no name resolves to it: a job that dials the number must be refused there too.
    Both addresses are on the private node's loopback, each with a server; the guard gets the
    gcp-tpu setup's own address list."""
    from infra.providers.gcp_tpu import users as gcp_users

    home = tmp_path / "ssh-home"
    (home / privilege.USERS_DIR).mkdir(parents=True)
    for script in ("users.sh", "guard.sh"):
        shutil.copy(paths.setup_dir() / "users" / script, home / privilege.USERS_DIR / script)
    (home / "scaler-file").write_text("x")
    v4, v6 = "169.254.169.254", "fd20:ce::254"
    assert {v4, v6} <= set(gcp_users.METADATA), gcp_users.METADATA

    def connect(user: str, target: str) -> str:
        run = f"python3 -c {shlex.quote(CONNECT)} {target} 8080 ''"
        return run if user == "root" else f"runuser -u {user} -- {run}"

    script = "; ".join([
        "set -e", "ip link set lo up", f"ip addr add {v4}/32 dev lo", f"ip -6 addr add {v6}/128 dev lo nodad",
        privilege.setup_users([], ["scaler-file"]),
        privilege.guard(*gcp_users.METADATA),
        f"python3 -m http.server 8080 --directory / --bind {v4} >/dev/null 2>&1 & a=$!",
        f"python3 -m http.server 8080 --directory / --bind {v6} >/dev/null 2>&1 & b=$!",
        *[f"for i in $(seq 300); do (exec 3<>/dev/tcp/{ip}/8080) 2>/dev/null && break; "
          "sleep 0.1; done" for ip in (v4, v6)],
        "set +e",
        *[f"echo {user}-{target} $({connect(user, target)})"
          for user in ("root", privilege.SCALER_USER, privilege.RAY_USER) for target in (v4, v6)],
        "nft list table inet rayfleet_guard",
        "kill $a $b",
    ])
    done = in_private_node(tmp_path, f"unshare --net bash -c {shlex.quote(script)}")
    assert done.returncode == 0, done.stdout + done.stderr
    answers = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                   if line.startswith(("root-", "rayfleet-")))
    http = json.dumps("HTTP/1.0 200")
    for target in (v4, v6):
        assert answers[f"root-{target}"] == http, answers
        assert answers[f"{privilege.SCALER_USER}-{target}"] == http, answers
        assert answers[f"{privilege.RAY_USER}-{target}"] == '"ConnectionRefusedError"', answers
    table = done.stdout
    assert f"ip daddr {v4}" in table and f"ip6 daddr {v6}" in table, table

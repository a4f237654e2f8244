"""Ray token authentication: one token per cluster, delivered as a 0600 file, presented by every client.

A Ray dashboard or job API that answers without authentication runs code for anyone who reaches it.
Every cluster rayfleet starts runs Ray with `RAY_AUTH_MODE=token`; the token is a random secret kept
in `.rayfleet/keys/<cluster>/ray-token` (0600, in a 0700 folder) and recorded in state by path only.
Nodes read it from a 0600 file named by `RAY_AUTH_TOKEN_PATH` (never from a command line or a
rendered file, which Ray copies to the head and logs); our clients send it as a bearer header.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from infra.core import paths
from infra.core.errors import RayfleetError
from infra.core.state import State
from infra.node.files import atomic_write, write_error

#: Where a remote node keeps its copy of the token (0600), relative to the login user's home.
NODE_TOKEN_PATH = "~/.rayfleet/ray-token"
TOKEN_FILE = "ray-token"


class AuthError(RayfleetError):
    """The cluster's token file is missing or unreadable."""


def token_path(cluster: str) -> Path:
    return paths.keys_dir(cluster) / TOKEN_FILE


def ensure_token(state: State, enabled: bool = True) -> Path | None:
    """The cluster's token file, created on first use; None (auth off) when not `enabled`.

    The path (never the token) goes into state, so every later command finds it.
    """
    if not enabled:
        if state.info.auth_token_path is not None:
            state.set_info(auth_token_path=None)
        return None
    path = token_path(state.cluster)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
    except OSError as exc:
        raise write_error(path.parent, exc) from None
    if not _usable(path):
        # Missing, or empty/unreadable (left by a version that wrote it in place on a full disk):
        # a new one, all or nothing. Ray accepts any printable token; 32 random bytes as hex is
        # what its own generator makes.
        atomic_write(path, secrets.token_hex(32), mode=0o600)
    os.chmod(path, 0o600)
    if state.info.auth_token_path != str(path):
        state.set_info(auth_token_path=str(path))
    return path


def rotate(state: State) -> Path:
    """A new token in the cluster's token file (all or nothing); the old one is gone."""
    path = ensure_token(state)
    assert path is not None
    atomic_write(path, secrets.token_hex(32), mode=0o600)
    return path


def _usable(path: Path) -> bool:
    """True when `path` holds a token Ray can use (printable, not empty)."""
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return False
    return bool(token) and token.isprintable()


def token_file(state: State) -> Path | None:
    """The token file recorded in state, or None when the cluster runs without auth."""
    recorded = state.info.auth_token_path
    return Path(recorded) if recorded else None


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise AuthError(
            f"cannot read the cluster's Ray token {path} ({exc.strerror}); "
            "run `invoke up` again to restore it"
        ) from None
    if not token:
        raise AuthError(f"the Ray token file {path} is empty; run `invoke up` again to restore it")
    return token


def headers(path: Path | None) -> dict[str, str]:
    """HTTP headers that authenticate to the cluster's dashboard and job API (empty: auth off)."""
    return {"Authorization": f"Bearer {read_token(path)}"} if path else {}


def node_env(path: str) -> dict[str, str]:
    """Environment for `ray start` on a node whose token file is at `path`."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": path}


def client_env(state: State) -> dict[str, str]:
    """Environment for Ray commands run here against the cluster (`ray up`, `ray down`, `ray status`).

    With auth off, `disabled` keeps Ray (2.59+) from turning token auth on by itself.
    """
    path = token_file(state)
    return node_env(str(path)) if path else {"RAY_AUTH_MODE": "disabled"}


def head_env(state: State, node_token_path: str) -> dict[str, str]:
    """Environment for Ray's own tools run ON the cluster's head (`invoke exec -- ray status`, a
    driver started in `invoke ssh`): the GCS address and the head's copy of the token."""
    env = {"RAY_ADDRESS": str(state.info.address)} if state.info.address else {}
    return {**env, **(node_env(node_token_path) if token_file(state)
                      else {"RAY_AUTH_MODE": "disabled"})}


def scrub(text: str, path: Path | None) -> str:
    """`text` with the token replaced, for anything that may end up in an error or a log."""
    if path is None:
        return text
    with contextlib.suppress(AuthError):
        token = read_token(path)
        return text.replace(token, "<ray-token>")
    return text

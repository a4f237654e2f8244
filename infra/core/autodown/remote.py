"""The autodown watcher (infra/node/autodown.py) on a head this machine reaches over SSH (Lambda,
GCP): putting it there supervised, stopping it, and reading its marker with whether it runs.

The mechanism is infra/core/remote_head.py (the node package, supervised daemons); this module holds
only what is the watcher's own: its config, marker and log paths on the head.
"""

from __future__ import annotations

import json

from infra.core import remote_head, ssh
from infra.core.autodown import view as autodown_view
from infra.node import autodown

#: infra/core/sharing/owner.py still reads the gateway's files through this name; the one home of reading a
#: file on a head is `remote_head.read_file` (this goes once sharing reads there).
read_file = remote_head.read_file


def install(target: ssh.SshTarget, config: autodown.Config,
            secrets: dict[str, bytes] | None = None, python: str = "python3",
            activate: str = "", user: str | None = None) -> None:
    """Put the node package, the watcher's config and `secrets` (home-relative path -> content,
    0600) on the head, then start the watcher there supervised unless it runs; as the node user
    `user` when given (the one that holds the cloud credential: infra/core/privilege.py), with its
    files in that user's home."""
    text = json.dumps(config.__dict__, indent=2) + "\n"
    remote_head.install_daemon(target, "infra.node.autodown", autodown.HEAD_CONFIG, text, secrets,
                               python=python, activate=activate, log=autodown.HEAD_LOG, user=user)


def stop(target: ssh.SshTarget, python: str = "python3", activate: str = "",
         user: str | None = None) -> None:
    """Stop the head's autodown watcher (and its supervisor) and remove its config."""
    remote_head.stop_daemon(target, autodown.HEAD_CONFIG, python, activate, user)


def head_marker(target: ssh.SshTarget, python: str = "python3", activate: str = "",
                user: str | None = None) -> str | None:
    """The watcher's marker on a running head, with `watcher_running` (does the watcher or its
    supervisor run, by process identity) when the head can say; None when it cannot say."""
    text, status = remote_head.read_with_status(target, autodown.HEAD_MARKER, autodown.HEAD_CONFIG,
                                                python, activate, user)
    return autodown_view.with_watcher_status(text, status)


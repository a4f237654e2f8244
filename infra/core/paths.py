"""Where rayfleet reads specs and writes what it generates.

Generated files live under one git-ignored folder, `.rayfleet/` in the project (override with
RAYFLEET_HOME, which tests use to keep every run apart). Functions, not module constants, so that
nothing is decided at import time.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

#: The checkout: infra/core/paths.py is two folders below it.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


#: What a wheel installs inside the package (setup.py puts templates/ and setup/ there).
SHIPPED = Path(__file__).resolve().parents[1] / "_shipped"


@functools.cache
def installed() -> bool:
    """rayfleet runs from an installed wheel (`pip install ./rayfleet`), not from its checkout (an
    editable install reads the checkout): the wheel alone carries infra/_shipped/."""
    return SHIPPED.is_dir()


def home() -> Path:
    """The folder for state, rendered configs, applied copies and keys: `.rayfleet/` in the
    checkout; for an installed rayfleet `~/.rayfleet/`, never inside site-packages (a joined
    member's token would sit in a folder every user of that Python may read, or none may write)."""
    if os.environ.get("RAYFLEET_HOME"):
        return Path(os.environ["RAYFLEET_HOME"])
    return Path.home() / ".rayfleet" if installed() else PROJECT_ROOT / ".rayfleet"


def clusters_dir() -> Path:
    """The folder of user specs, `clusters/` unless RAYFLEET_CLUSTERS points elsewhere: the
    checkout's, or for an installed rayfleet the one in the folder it runs in (a class's
    repository, say)."""
    if os.environ.get("RAYFLEET_CLUSTERS"):
        return Path(os.environ["RAYFLEET_CLUSTERS"])
    return Path.cwd() / "clusters" if installed() else PROJECT_ROOT / "clusters"


def shipped(name: str) -> Path:
    """`templates` or `setup`: the copy a wheel installs inside the package (infra/_shipped/, put
    there by setup.py), else the checkout's own folder (a source checkout, an editable install)."""
    return SHIPPED / name if installed() else PROJECT_ROOT / name


def templates_dir() -> Path:
    return shipped("templates")


def setup_dir() -> Path:
    return shipped("setup")


def state_dir() -> Path:
    return home() / "state"


def rendered_dir(cluster: str) -> Path:
    """What `plan`/`up` rendered most recently for a cluster."""
    return home() / "rendered" / cluster


def applied_dir(cluster: str) -> Path:
    """Copies of the rendered files as of the last successful `up`, for `plan`'s diff."""
    return home() / "applied" / cluster


def keys_dir(cluster: str) -> Path:
    """Private keys rayfleet generated for a cluster (0700 folder, 0600 files)."""
    return home() / "keys" / cluster

"""Where rayfleet reads specs and writes what it generates.

Generated files live under one git-ignored folder, `.rayfleet/` in the project (override with
RAYFLEET_HOME, which tests use to keep every run apart). Functions, not module constants, so that
nothing is decided at import time.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def home() -> Path:
    """The folder for state, rendered configs, applied copies and keys."""
    return Path(os.environ.get("RAYFLEET_HOME") or PROJECT_ROOT / ".rayfleet")


def clusters_dir() -> Path:
    """The folder of user specs, `clusters/` unless RAYFLEET_CLUSTERS points elsewhere."""
    return Path(os.environ.get("RAYFLEET_CLUSTERS") or PROJECT_ROOT / "clusters")


def shipped(name: str) -> Path:
    """`templates` or `setup`: the copy a wheel installs inside the package (infra/_shipped/, put
    there by setup.py), else the checkout's own folder (a source checkout, an editable install)."""
    installed = Path(__file__).resolve().parent / "_shipped" / name
    return installed if installed.is_dir() else PROJECT_ROOT / name


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

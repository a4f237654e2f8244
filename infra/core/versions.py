"""The versions every node of a cluster must share with this machine: the one place pins come from.

A Ray cluster breaks in confusing ways when the client that runs `invoke up`/`submit`, the head and
the workers disagree on the Ray version (protocol errors, jobs that hang) or on the Python minor
version (pickled functions and objects do not load). So nodes get exactly this machine's Ray and
Python major.minor: templates pass `node_pins()` to `setup/install.sh`, and `invoke doctor` checks
a running cluster against the same function.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Mapping

#: Node environments `setup/install.sh --env` knows (auto = detect the accelerator on the node).
ENV_KINDS = ("cpu", "gpu", "tpu", "auto")


def node_pins() -> dict[str, str]:
    """This machine's Ray version and Python major.minor, e.g. {"ray_version": "2.60.0",
    "python_version": "3.11"}. Read from package metadata, so Ray is not imported."""
    return {
        "ray_version": importlib.metadata.version("ray"),
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def install_args(env: str, *, backend: str | None = None, prefix: str | None = None,
                 log: str | None = None) -> list[str]:
    """Arguments for `bash setup/install.sh` that install this machine's pins on a node.

    Templates render them with `shjoin`; the order is fixed so rendered files are deterministic.
    """
    if env not in ENV_KINDS:
        raise ValueError(f"env {env!r} is not one of {', '.join(ENV_KINDS)}")
    pins = node_pins()
    args = ["--env", env, "--ray-version", pins["ray_version"],
            "--python-version", pins["python_version"]]
    for flag, value in (("--backend", backend), ("--prefix", prefix), ("--log", log)):
        if value is not None:
            args += [flag, value]
    return args


def python_minor(version: str) -> str:
    """"3.11.7" -> "3.11" (a node reports its full version; pins compare major.minor)."""
    return ".".join(version.split(".")[:2])


def mismatches(reported: Mapping[str, str], pins: Mapping[str, str] | None = None) -> list[str]:
    """What differs between a node's reported versions and the pins, as readable phrases.

    `reported` has "ray_version" and "python_version" (full, e.g. "3.11.7"); an empty list means
    the node matches this machine.
    """
    pins = pins or node_pins()
    found = []
    ray = reported.get("ray_version", "?")
    if ray != pins["ray_version"]:
        found.append(f"Ray {ray} (this machine: {pins['ray_version']})")
    python = python_minor(reported.get("python_version", "?"))
    if python != pins["python_version"]:
        found.append(f"Python {python} (this machine: {pins['python_version']})")
    return found

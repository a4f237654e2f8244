"""Run the Slurm node helper as the batch script does: from the shipped node zip, with
`python -m`, in a folder that is not this checkout (so nothing resolves from the working tree)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from infra.core import shipping
from infra.providers.slurm import script


@functools.cache
def zip_path() -> Path:
    """The node package zip, written once per test process (its name carries its content hash)."""
    folder = Path(tempfile.mkdtemp(prefix="rf-nodezip-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / shipping.zip_name(script.NODE_PACKAGES)
    path.write_bytes(shipping.node_zip(script.NODE_PACKAGES))
    return path


def helper_env(env: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """`env` over `base` (default: this process's), the zip first on PYTHONPATH as `rf_helper` puts it."""
    merged = {**(os.environ if base is None else base), **(env or {})}
    path = str(zip_path())
    merged["PYTHONPATH"] = path + (os.pathsep + merged["PYTHONPATH"] if merged.get("PYTHONPATH") else "")
    merged["RF_PY"] = path
    return merged


def argv(*args: str, python: tuple[str, ...] = (sys.executable,)) -> list[str]:
    return [*python, "-m", "infra.node.slurm.node_helper", *args]


def helper(*args: str, env: dict[str, str] | None = None, base: dict[str, str] | None = None,
           python: tuple[str, ...] = (sys.executable,)) -> subprocess.CompletedProcess[str]:
    """Run the helper exactly as the batch script does (`rf_helper` in slurm.environment.j2)."""
    return subprocess.run(argv(*args, python=python), capture_output=True, text=True, timeout=60,
                          env=helper_env(env, base), cwd=zip_path().parent)

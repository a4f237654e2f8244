"""Where things are, said once for the laptop and the nodes alike (standard library only).

- `home_path`: a `~/`-relative path as a shell word that expands on the machine running it (a
  quoted `~` does not expand, so the home goes in as "$HOME").
- `ray_executable`: the `ray` of the Python running this code (its virtualenv's, even when that
  is not on PATH), else the first on PATH.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys


def home_path(path: str) -> str:
    """`path` as one POSIX shell word: `~` and `~/x` become "$HOME" and "$HOME"/x (the rest
    quoted), anything else is quoted as it is."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def ray_executable(default: str = "ray") -> str:
    """The `ray` beside this interpreter, else the one on PATH, else `default`."""
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    if os.path.exists(beside):
        return beside
    return shutil.which("ray") or default

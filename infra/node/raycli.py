"""Ray's own command line (`ray start`, `ray stop`), loaded without the groups a node never uses,
where that is proven for the Ray at hand.

Ray's `ray.scripts.scripts` ends by importing three optional command groups, each inside its own
try/except so that Ray works without them: Serve's CLI (which loads Ray Serve, FastAPI and
pandas), the job CLI and the state CLI. With ray[serve] installed they are ~0.9 s of the 1.2 s
that `ray` spends importing before it does anything (`python -X importtime`, this project's test
machine), paid by every `ray start` and `ray stop` on every node: the scale-up floor of issue 38
counts it on each new worker's way to joining. Here the same module is imported with those three
marked absent for the length of that import, as an install without them would be; `start`,
`stop` and every other command are Ray's own, unchanged. The marks are taken away right after,
so anything that imports those modules later (a command that needs them) gets them as usual.

That holds for the Ray it was checked against (`PROVEN`, tests/node/test_raycli.py): a node whose
Ray is another version (one the user brings: Lambda's `env: none`, Slurm's `activate`) runs
Ray's CLI as Ray's own `ray` script does, and says so in one line on stderr (the node's log).

- `RUN`: a Python program; `python -c RUN ARGS` does what `ray ARGS` does.
- `interpreter`: the Python a `ray` script names in its first line (pip writes it there), which
  is the one Ray was installed into, wherever that is (a venv, `pip --user`, the system).
- `RAY`: shell words to use in place of `ray` in a node's command line (`{RAY} start ...`):
  `PYTHON`, the Python beside the `ray` on PATH (our node env, which has one).
- `argv_here`: `RUN` as an argument list for a `ray` script's own Python (a member cluster's head;
  local `up` and cloud nodes run setup/users/ray.sh, which carries `RUN` and finds that Python).
- `main`: Ray's CLI entry point in this process (Slurm's node helper runs `ray start` so).

Standard library only: Slurm's nodes import this without Ray's dependencies on the path.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any

#: The command groups Ray's CLI module adds only if they import (ray/scripts/scripts.py, the end).
OPTIONAL_GROUPS = ("ray.serve.scripts", "ray.util.state.state_cli",
                   "ray.dashboard.modules.job.cli")

_GROUPS = ", ".join(f'"{name}"' for name in OPTIONAL_GROUPS)

#: The Ray whose CLI module was checked to import those groups only if it can.
PROVEN = "2.60.0"

#: Imports Ray's CLI entry point as `main` (the marks only for the proven Ray), and says on stderr
#: which way it went. One statement a line: it travels inside start scripts and command lines.
IMPORT = f"""import sys
import ray
rf_skip = [n for n in ({_GROUPS}) if n not in sys.modules]
if ray.__version__ != "{PROVEN}":
    rf_skip = []
    print("rayfleet: plain ray: Ray " + ray.__version__ + " here, raycli is proven with {PROVEN}",
          file=sys.stderr)
sys.modules.update(dict.fromkeys(rf_skip))
from ray.scripts.scripts import main
[sys.modules.pop(n) for n in rf_skip if sys.modules.get(n, 0) is None]
"""

#: `python -c RUN ARGS` does what `ray ARGS` does (Ray's console script names itself `ray`).
RUN = IMPORT + 'sys.argv[0] = "ray"\nsys.exit(main())\n'

#: The Python beside the `ray` on PATH, as a shell word: the node env's (it has one).
PYTHON = '"$(dirname "$(command -v ray)")/python"'

#: `ray` for a node's shell command line, after the environment's activation put Ray on PATH.
RAY = f"{PYTHON} -c {shlex.quote(RUN)}"


def main() -> Callable[[], Any]:
    """Ray's CLI entry point (`ray.scripts.scripts.main`), imported as `RUN` imports it."""
    names: dict[str, Any] = {}
    exec(IMPORT, names)  # the one text that start scripts carry too
    entry: Callable[[], Any] = names["main"]
    return entry


def interpreter(ray: str) -> str | None:
    """The Python that the `ray` script at `ray` runs with: its `#!` line's (`#!/usr/bin/env
    python3` looked up on PATH; pip's `#!/bin/sh` launcher for long paths, its `exec` line's),
    or None when it names no Python that exists (a missing file, a binary, another launcher)."""
    try:
        with open(ray, "rb") as handle:
            head = handle.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    if words[:1] == ["/bin/sh"] and len(head) > 1 and head[1].startswith("'''exec' \""):
        words = [head[1].split('"')[1]]
    elif words and os.path.basename(words[0]) == "env" and len(words) > 1:
        import shutil

        words = [shutil.which(words[1]) or ""]
    python = words[0] if words else ""
    ok = os.path.basename(python).startswith("python") and os.access(python, os.X_OK)
    return python if ok else None


def argv_here(ray: str) -> list[str]:
    """`ray` (a path to Ray's script) as an argument list: its own Python with `RUN`, else the
    script itself (its first line names no Python)."""
    python = interpreter(ray)
    return [python, "-c", RUN] if python else [ray]

"""Ray's own command line (`ray start`, `ray stop`), loaded without the groups a node never uses.

Ray's `ray.scripts.scripts` ends by importing three optional command groups, each inside its own
try/except so that Ray works without them: Serve's CLI (which loads Ray Serve, FastAPI and
pandas), the job CLI and the state CLI. With ray[serve] installed they are ~0.9 s of the 1.2 s
that `ray` spends importing before it does anything (`python -X importtime`, this project's test
machine), paid by every `ray start` and `ray stop` on every node: the scale-up floor of issue 38
counts it on each new worker's way to joining. Here the same module is imported with those three
marked absent for the length of that import, as an install without them would be; `start`,
`stop` and every other command are Ray's own, unchanged. The marks are taken away right after,
so anything that imports those modules later (a command that needs them) gets them as usual.

- `RAY`: shell words to use in place of `ray` in a node's command line (`{RAY} start ...`):
  `PYTHON`, the Python beside the `ray` on PATH (the head's monitor runs with it too).
- `argv_here`: the same as an argument list, for the Python running this code (local `up`).
- `main`: Ray's CLI entry point in this process (Slurm's node helper runs `ray start` so).

Standard library only: Slurm's nodes import this without Ray's dependencies on the path.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

#: The command groups Ray's CLI module adds only if they import (ray/scripts/scripts.py, the end).
OPTIONAL_GROUPS = ("ray.serve.scripts", "ray.util.state.state_cli",
                   "ray.dashboard.modules.job.cli")

#: Imports Ray's CLI entry point as `main`; one line, as it travels inside command lines.
IMPORT = ("import sys; rf_skip = [n for n in (" + ", ".join(f'"{n}"' for n in OPTIONAL_GROUPS)
          + ") if n not in sys.modules]; "
          "sys.modules.update(dict.fromkeys(rf_skip)); "
          "from ray.scripts.scripts import main; "
          "[sys.modules.pop(n) for n in rf_skip if sys.modules.get(n, 0) is None]")

#: `python -c RUN ARGS` does what `ray ARGS` does (Ray's console script names itself `ray`).
RUN = IMPORT + '; sys.argv[0] = "ray"; sys.exit(main())'

#: The Python beside the `ray` on PATH, as a shell word: the one Ray was installed into.
PYTHON = '"$(dirname "$(command -v ray)")/python"'

#: `ray` for a node's shell command line, after the environment's activation put Ray on PATH.
RAY = f"{PYTHON} -c {shlex.quote(RUN)}"


def main() -> Callable[[], Any]:
    """Ray's CLI entry point (`ray.scripts.scripts.main`), imported as `RUN` imports it."""
    names: dict[str, Any] = {}
    exec(IMPORT, names)  # the one text that command lines carry too
    entry: Callable[[], Any] = names["main"]
    return entry


def argv_here(ray: str) -> list[str]:
    """`ray` (a path to Ray's script) as an argument list: this Python with `RUN` when that
    script is the one beside this Python, else the script itself."""
    if os.path.dirname(os.path.abspath(ray)) == os.path.dirname(os.path.abspath(sys.executable)):
        return [sys.executable, "-c", RUN]
    return [ray]

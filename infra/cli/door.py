"""What every task of the front door shares: the options that name a cluster, and the one way a
task turns rayfleet's errors into one line and an exit code. Imports only Invoke (listing tasks
stays fast)."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

from invoke import Exit

CLUSTER_HELP = {
    "provider": "Provider: local (default), gcp-tpu, lambda or slurm. Picks clusters/<provider>.yaml.",
    "cluster": "A spec name in clusters/ or a path to a spec YAML (its provider: must agree "
               "with --provider if both are given).",
}


def one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn rayfleet's errors into one line on stderr and the error's exit code."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from infra.core.errors import RayfleetError

        # Invoke's own program (`invoke` in a checkout) hands a flag that follows a task to its
        # positional argument, so `invoke submit --help` would try to submit a script named
        # "--help": the task's help instead, as the `rayfleet` command shows it (cli_help.py).
        if any(value in ("-h", "--help") for value in (*args[1:], *kwargs.values())):
            name = func.__name__.replace("_", "-")
            # This checkout's infra, from whatever directory `invoke -r` ran in.
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
            os.execve(sys.executable, [sys.executable, "-m", "infra", "--help", name],
                      {**os.environ, "PYTHONPATH": path})

        try:
            code = func(*args, **kwargs)
        except RayfleetError as exc:
            raise Exit(f"error: {exc}", code=exc.exit_code) from None
        except KeyboardInterrupt:
            raise Exit("interrupted", code=130) from None
        finally:
            # The command is done: Python's exit would otherwise walk every object that Ray's and
            # Serve's imports made (~150,000) in a last garbage collection, about a second on a
            # busy machine after every command that talked to Ray (bench/serve_deploy.py).
            gc.freeze()
        if code:
            raise Exit(code=code)

    return wrapper

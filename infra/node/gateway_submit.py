"""A member's job submission as the gateway forwards it: its id, environment and packages checked.

Ray checks only that a `submission_id` is a string, and pastes it into every later URL of the job:
an id like `x?y` made a job nobody could stop, `x/../VICTIM` turned a stop onto another's job. So
an id is 1 to 64 letters, digits, `_` or `-` (Ray's own `raysubmit_...` fit), the gateway makes one
when the member sends none, and an id the gateway has a record of is never given out again. Ray's
job supervisor reads how it stops a job from the job's own environment, so those names are refused.
Standard library only: it ships to heads in the node package.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from typing import Any

from infra.node import gateway_packages as gk
from infra.node import gateway_state as gs
from infra.node import gateway_target as gt

#: The job's environment that tags every MLflow run it starts (MLflow's own run-context variable).
MLFLOW_CONTEXT = "MLFLOW_RUN_CONTEXT"
#: Environment variables a member's job may not set: Ray's job supervisor reads these from the
#: job's own environment (RAY_JOB_STOP_WAIT_TIME_S at 10^9 made a job outlive every stop).
SUPERVISOR_ENV = re.compile(r"RAY_JOB_.*|RAY_AUTH.*|RAY_ADDRESS|RAY_RUNTIME_ENV_.*|RAY_kill_.*",
                            re.IGNORECASE)
#: Ray's own submission ids: `raysubmit_` and 16 letters or digits.
_ALPHABET = string.ascii_letters + string.digits


class Refused(ValueError):
    """The submission is not forwarded (400 with this one line)."""


def new_id() -> str:
    return "raysubmit_" + "".join(secrets.choice(_ALPHABET) for _ in range(16))


def prepare(body: dict[str, Any], who: gs.Member,
            taken: Callable[[str], bool]) -> tuple[str, dict[str, Any]]:
    """The submission id and the body to forward for `who`'s submit `body`, or Refused.
    `taken(id)`: the gateway has a record of that id (it is never given out again)."""
    job = body.get("submission_id") or body.get("job_id") or new_id()
    if not isinstance(job, str) or gt.job_id_or_none(job) is None:
        raise Refused("submission_id: 1 to 64 letters, digits, '_' or '-'; or leave it out")
    if taken(job):
        raise Refused(f"submission_id {job} is taken; choose another or leave it out")
    given = body.get("runtime_env")
    runtime_env: dict[str, Any] = given if isinstance(given, dict) else {}
    env_vars = _str_dict(runtime_env.get("env_vars"))
    for name in env_vars:
        if SUPERVISOR_ENV.fullmatch(name):
            raise Refused(f"runtime_env.env_vars: {name} is Ray's own setting for how a job is "
                          "run and stopped; members may not set it (remove it)")
    try:
        runtime_env = gk.scope_runtime_env(runtime_env, who.id)
    except gk.Refused as exc:
        raise Refused(str(exc)) from None
    env_vars[MLFLOW_CONTEXT] = json.dumps({**_json_dict(env_vars.get(MLFLOW_CONTEXT)),
                                           "mlflow.user": who.name, "rayfleet.member": who.name})
    out = {k: v for k, v in body.items() if k != "job_id"}
    # For MLflow and for people reading Ray's list; never read back as proof of who submitted.
    out["metadata"] = {**_str_dict(body.get("metadata")), "rayfleet_member": who.name}
    out["runtime_env"] = {**runtime_env, "env_vars": env_vars}
    out["submission_id"] = job
    return job, out


def _str_dict(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _json_dict(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

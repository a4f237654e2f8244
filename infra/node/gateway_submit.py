"""A member's job submission as the gateway forwards it: every field named on an allow-list.

Ray checks little of a submission and runs much of it: `runtime_env.py_executable` is the driver's
command prefix, `worker_process_setup_hook` runs in every worker, `env_vars` reach the job's
supervisor (which reads how it stops a job from them), `bash -c` (BASH_ENV, SHELLOPTS, PS4) and
Python (PYTHONPATH, PYTHONWARNINGS), and metadata overrides the `job_submission_id` by which Ray
ties a driver to its submission. A deny-list let each name it missed through, so here a field
passes only when it is named below, with its value's type (and a member's one line says which
field and what to do otherwise):

- top level: `entrypoint`, `submission_id` (`job_id`: its old name), `runtime_env`, `metadata`,
  `entrypoint_num_cpus`, `entrypoint_num_gpus`, `entrypoint_memory`, `entrypoint_resources`,
  `entrypoint_label_selector` (Ray 2.60's JobSubmitRequest; all a stock client sends);
- `runtime_env`: `working_dir`, `py_modules` (the member's own `gcs://` packages, or archives at
  `https://`, `s3://`, `gs://`), `excludes`, `env_vars` (names off `REFUSED_ENV`), `config`
  (`setup_timeout_seconds`, `eager_install`, `log_files` empty: what Ray's RuntimeEnvConfig sends
  by default); `pip` and `uv` (and the `_ray_commit` Ray's client adds beside them) only with
  `sharing.members_may_pip`, since a package installs by running its own code;
- numbers non-negative and finite; custom resources not Ray's own (CPU, GPU, memory,
  object_store_memory, `node:…`, `accelerator_type:…`, a placement group's `…_group_…`);
  metadata string to string, at most METADATA_BYTES as JSON.

What no filter here reaches: the job's own files run as code (a `sitecustomize.py` in the working
dir runs in the driver and in the job's supervisor, which Ray starts with the job's runtime env;
a pip package's `.pth` likewise), so a stop is made sure of by the gateway (gateway_stops.py).

A submission id is 1 to 64 letters, digits, `_` or `-` (an id is pasted into every later URL of
the job) and never 8 hex digits (gateway_target.member_may_name); the gateway makes one when the
member sends none, and an id it has a record of is never given out again. Standard library only:
it ships to heads in the node package.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import string
from collections.abc import Callable
from typing import Any

from infra.node import gateway_packages as gk
from infra.node import gateway_state as gs
from infra.node import gateway_target as gt

#: The job's environment that tags every MLflow run it starts (MLflow's own run-context variable).
#: The gateway sets it (its keys win over a member's).
MLFLOW_CONTEXT = "MLFLOW_RUN_CONTEXT"
#: Environment variable names a member's job may not set (matched ignoring case): Ray's own
#: settings (RAY_JOB_STOP_WAIT_TIME_S at 10^9 made a job outlive every stop; RAY_ADDRESS, the
#: token), what makes the dynamic loader, Python or bash run other code or run differently
#: (LD_PRELOAD, PYTHONPATH, PYTHONWARNINGS imports a module, BASH_ENV, ENV, SHELLOPTS=xtrace with
#: PS4, IFS, PATH, HOME: Python's user site and Ray's default token path), and the cluster's
#: tracking credentials.
REFUSED_ENV = re.compile(
    r"RAY_.*|LD_.*|PYTHON.*|BASH_ENV|ENV|BASH_FUNC_.*|BASHOPTS|SHELLOPTS|PS[0-4]|PROMPT_COMMAND|"
    r"IFS|PATH|CDPATH|GLOBIGNORE|HOME|GCONV_PATH|GLIBC_TUNABLES|MLFLOW_TRACKING_.*",
    re.IGNORECASE)
#: An environment variable's name as a shell and Ray's supervisor take it.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Fields of Ray's JobSubmitRequest a member may send.
TOP_LEVEL = ("entrypoint", "submission_id", "job_id", "runtime_env", "metadata",
             "entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory",
             "entrypoint_resources", "entrypoint_label_selector")
#: runtime_env keys a member may send; PIP_KEYS too when the cluster's spec allows.
RUNTIME_ENV = ("working_dir", "py_modules", "excludes", "env_vars", "config")
PIP_KEYS = ("pip", "uv", "_ray_commit")
#: Where a working dir or module may come from: a package the member uploaded (`gcs://`, mapped
#: to their own by gateway_packages) or an archive fetched from object storage or the web. Not
#: `file://` (the node's own files) nor `http://` (the head's loopback services, the cloud's
#: metadata server).
_PACKAGE_SCHEMES = ("gcs://", "https://", "s3://", "gs://")
#: Ray's custom resources that are not custom: its own names, a node's, an accelerator's marker,
#: and those of a placement group's bundles (asking for one takes another job's reservation).
_RAY_RESOURCES = re.compile(r"CPU|GPU|memory|object_store_memory|node:.*|accelerator_type:.*"
                            r"|.+_group_.+", re.IGNORECASE)
#: Metadata keys Ray reads itself (`job_submission_id` ties a driver to a submission; a member's
#: value would tie their driver to another's job) or the gateway writes.
_METADATA_RESERVED = re.compile(r"job_submission_id|job_name|rayfleet_.*", re.IGNORECASE)
#: The most metadata one submission carries, as JSON (Ray's list repeats it for every job).
METADATA_BYTES = 16 * 1024
#: Ray's own submission ids: `raysubmit_` and 16 letters or digits.
_ALPHABET = string.ascii_letters + string.digits


class Refused(ValueError):
    """The submission is not forwarded (400 with this one line)."""


def new_id() -> str:
    return "raysubmit_" + "".join(secrets.choice(_ALPHABET) for _ in range(16))


def prepare(body: dict[str, Any], who: gs.Member, taken: Callable[[str], bool],
            may_pip: bool = False) -> tuple[str, dict[str, Any]]:
    """The submission id and the body to forward for `who`'s submit `body`, or Refused.
    `taken(id)`: the gateway has a record of that id (it is never given out again).
    `may_pip`: `sharing.members_may_pip`."""
    # Ray drops fields whose value is null before reading a submission: so does the gateway.
    body = {k: v for k, v in body.items() if v is not None}
    for key in body:
        if key not in TOP_LEVEL:
            raise Refused(f"{str(key)[:80]}: not a field of a job submission members may send "
                          f"(they send {', '.join(TOP_LEVEL)}); remove it")
    if not isinstance(body.get("entrypoint"), str) or not body["entrypoint"].strip():
        raise Refused("entrypoint: the job's shell command, a non-empty string")
    job = submission_id(body, taken)
    runtime_env = checked_runtime_env(body.get("runtime_env"), may_pip)
    try:
        runtime_env = gk.scope_runtime_env(runtime_env, who.id)
    except gk.Refused as exc:
        raise Refused(str(exc)) from None
    env_vars = dict(runtime_env.get("env_vars") or {})
    env_vars[MLFLOW_CONTEXT] = json.dumps({**_json_dict(env_vars.get(MLFLOW_CONTEXT)),
                                           "mlflow.user": who.name, "rayfleet.member": who.name})
    out = {k: v for k, v in body.items() if k != "job_id"}
    out.update(checked_resources(body))
    # For MLflow and for people reading Ray's list; never read back as proof of who submitted.
    out["metadata"] = {**checked_metadata(body.get("metadata")), "rayfleet_member": who.name}
    out["runtime_env"] = {**runtime_env, "env_vars": env_vars}
    out["submission_id"] = job
    return job, out


def submission_id(body: dict[str, Any], taken: Callable[[str], bool]) -> str:
    """The submission's id: the member's (`submission_id`, else its old name `job_id`) or a new
    one; Refused when Ray could read it as another job's or the gateway gave it out before."""
    job = body.get("submission_id") or body.get("job_id") or new_id()
    if not isinstance(job, str):
        raise Refused("submission_id: a string of 1 to 64 letters, digits, '_' or '-'; or "
                      "leave it out")
    why = gt.member_may_name(job)
    if why is not None:
        raise Refused(f"submission_id {job[:80]!r}: {why}")
    if taken(job):
        raise Refused(f"submission_id {job} is taken; choose another or leave it out")
    return job


def checked_runtime_env(value: Any, may_pip: bool) -> dict[str, Any]:
    """`value` when every key and value of it is one a member may send, else Refused naming the
    first that is not."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Refused("runtime_env: a JSON object (working_dir, env_vars, ...); or leave it out")
    allowed = RUNTIME_ENV + (PIP_KEYS if may_pip else ())
    for key in value:
        if key in allowed:
            continue
        if key in ("pip", "uv"):
            raise Refused(f"runtime_env.{key}: members may not install packages on this cluster "
                          "(the owner allows it with sharing.members_may_pip); put what you need "
                          "in your working_dir or ask the owner")
        raise Refused(f"runtime_env.{str(key)[:80]}: members may not set it; the gateway takes "
                      f"only {', '.join(allowed)}")
    out = {k: v for k, v in value.items() if v is not None}
    if "working_dir" in out:
        _package("runtime_env.working_dir", out["working_dir"])
    if "py_modules" in out:
        modules = out["py_modules"]
        if not isinstance(modules, list):
            raise Refused("runtime_env.py_modules: a list of package URIs")
        for module in modules:
            _package("runtime_env.py_modules", module)
    if "excludes" in out:
        _strings("runtime_env.excludes", out["excludes"])
    if "env_vars" in out:
        out["env_vars"] = checked_env_vars(out["env_vars"])
    if "config" in out:
        _runtime_env_config(out["config"])
    for key in ("pip", "uv"):
        if key in out and not isinstance(out[key], (str, list, dict)):
            raise Refused(f"runtime_env.{key}: a list of packages, a requirements file's name or "
                          "Ray's object form")
    if "_ray_commit" in out and not isinstance(out["_ray_commit"], str):
        raise Refused("runtime_env._ray_commit: a string (Ray's client sets it); remove it")
    return out


def checked_env_vars(value: Any) -> dict[str, str]:
    """The job's environment variables when each is one a member may set, else Refused."""
    if not isinstance(value, dict):
        raise Refused("runtime_env.env_vars: a JSON object of names to string values")
    for name, setting in value.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise Refused(f"runtime_env.env_vars: {str(name)[:80]!r} is not a variable name "
                          "(letters, digits and '_', not starting with a digit)")
        if REFUSED_ENV.fullmatch(name):
            raise Refused(f"runtime_env.env_vars.{name}: members may not set it (it changes how "
                          "Ray, Python or the shell runs or stops the job); remove it")
        if not isinstance(setting, str):
            raise Refused(f"runtime_env.env_vars.{name}: its value must be a string; quote it")
    return dict(value)


def checked_resources(body: dict[str, Any]) -> dict[str, Any]:
    """The entrypoint's resource fields of `body` when each is a request a member may make."""
    out: dict[str, Any] = {}
    for key in ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory"):
        if key in body:
            out[key] = _amount(key, body[key], whole=key == "entrypoint_memory")
    if "entrypoint_resources" in body:
        resources = body["entrypoint_resources"]
        if not isinstance(resources, dict):
            raise Refused("entrypoint_resources: a JSON object of custom resource names to numbers")
        for name, amount in resources.items():
            if not isinstance(name, str) or not name or _RAY_RESOURCES.fullmatch(name):
                raise Refused(f"entrypoint_resources: {str(name)[:80]!r} is Ray's own resource, "
                              "not a custom one; ask for CPUs, GPUs and memory with "
                              "entrypoint_num_cpus, entrypoint_num_gpus and entrypoint_memory")
            _amount(f"entrypoint_resources.{name}", amount)
        out["entrypoint_resources"] = resources
    if "entrypoint_label_selector" in body:
        selector = body["entrypoint_label_selector"]
        if not isinstance(selector, dict) or len(selector) > 64 or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
            raise Refused("entrypoint_label_selector: a JSON object of label names to string "
                          "values (at most 64)")
        out["entrypoint_label_selector"] = selector
    return out


def checked_metadata(value: Any) -> dict[str, str]:
    """The member's metadata when it is string to string, small, and names no key Ray or the
    gateway reads; else Refused."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Refused("metadata: a JSON object of string keys to string values")
    for key in value:
        if _METADATA_RESERVED.fullmatch(key):
            raise Refused(f"metadata.{key[:80]}: Ray or the gateway sets it (it ties a driver to "
                          "its submission, or names the member); remove it")
    size = len(json.dumps(value).encode())
    if size > METADATA_BYTES:
        raise Refused(f"metadata: {size} bytes as JSON, more than the {METADATA_BYTES} a job "
                      "may carry; keep it short")
    return dict(value)


def _package(field: str, uri: Any) -> None:
    if not isinstance(uri, str) or not uri.startswith(_PACKAGE_SCHEMES):
        schemes = ", ".join(_PACKAGE_SCHEMES)
        raise Refused(f"{field}: {repr(uri)[:80]} is not a package the gateway forwards "
                      f"({schemes}); Ray's client uploads a local folder as gcs:// itself")


def _strings(field: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Refused(f"{field}: a list of strings")


def _runtime_env_config(config: Any) -> None:
    """Only what Ray's RuntimeEnvConfig sends: its setup timeout, eager install, and `log_files`
    as it sends it by default (empty: files named there are read on the node and shown)."""
    if not isinstance(config, dict):
        raise Refused("runtime_env.config: a JSON object (setup_timeout_seconds, eager_install)")
    for key, value in config.items():
        if key == "setup_timeout_seconds":
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    value == -1 or 0 < value <= 24 * 3600):
                raise Refused("runtime_env.config.setup_timeout_seconds: whole seconds, 1 to "
                              "86400, or -1")
        elif key == "eager_install":
            if not isinstance(value, bool):
                raise Refused("runtime_env.config.eager_install: true or false")
        elif key == "log_files":
            if value not in (None, []):
                raise Refused("runtime_env.config.log_files: members may not name files to "
                              "read on the node; leave it out")
        else:
            raise Refused(f"runtime_env.config.{str(key)[:80]}: members may not set it; the "
                          "gateway takes setup_timeout_seconds and eager_install")


def _amount(field: str, value: Any, whole: bool = False) -> int | float:
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) \
            or value < 0:
        kind = "a whole number" if whole else "a number"
        raise Refused(f"{field}: {kind}, 0 or more")
    return value


def _json_dict(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

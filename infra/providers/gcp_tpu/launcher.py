"""Running Ray's cluster launcher (`ray up`, `ray down`) and reading its failures.

The provider receives the runner as a parameter (`RayRunner`), so tests substitute a fake that
acts on the fake Google APIs; `run_ray` is the real one: a subprocess whose output streams to a
log file and, line by line, to the progress display.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from infra.core import ssh
from infra.node.gcp_tpu.api import (
    GcpApiDisabledError,
    GcpCredentialsError,
    GcpError,
    GcpPermissionError,
    GcpQuotaError,
)
from infra.node.where import ray_executable

#: (arguments, environment, log file, progress callback) -> exit code.
RayRunner = Callable[[list[str], dict[str, str], Path, Callable[[str], None]], int]
#: (the head, replace the running one?) -> None: what starts Ray's autoscaler on a head after
#: `ray up` (remote_head.start_ray_up_monitor; tests with a stand-in `ray` pass their own).
MonitorStarter = Callable[[ssh.SshTarget, bool], None]

#: `ray up`/`ray down` may not hang forever (a TPU slice can take ~15 minutes to come up).
RAY_TIMEOUT_S = 3600


def up_args(config: Path) -> list[str]:
    # --no-config-cache: Ray would otherwise reuse /tmp/ray-config-<hash> from an earlier run.
    return [ray_executable(), "up", "-y", "--no-config-cache", "--log-style=record",
            "--log-color=false", str(config)]


def down_args(config: Path) -> list[str]:
    return [ray_executable(), "down", "-y", "--log-style=record", "--log-color=false", str(config)]


def remove_config_caches(cluster: str, project: str) -> list[str]:
    """Remove Ray's `/tmp/ray-config-<hash>` files of this cluster; the paths removed.

    `ray down` has no --no-config-cache: it re-runs the provider's bootstrap and caches the result
    (the head's service account, the key path) in the temp dir, where it would outlive the cluster.
    Only files whose cached config names this cluster and project are touched.
    """
    import glob
    import json
    import tempfile

    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "ray-config-*")):
        try:
            with open(path) as handle:
                cached = json.load(handle)
            config = cached.get("config", cached)
            ours = (config.get("cluster_name") == cluster
                    and config.get("provider", {}).get("project_id") == project)
            if ours and os.stat(path).st_uid == os.getuid():
                os.remove(path)
                removed.append(path)
        except (OSError, ValueError, AttributeError):
            continue
    return removed


def ray_env(credentials_file: str | None, auth_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `ray up`/`ray down` run in.

    Usage statistics off; output unbuffered for live progress; Ray's GCP provider finds the key
    file through the standard variable (only its path, the file itself stays where it is);
    autoscaler v1 unless the user chose v2 (see NOTES.md).
    """
    env = dict(os.environ)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"  # Ray's progress lines as they happen, not in 8 KiB bursts
    env.setdefault("RAY_UP_enable_autoscaler_v2", "0")
    env.update(auth_env or {})  # the token's path (never the token), as every Ray client of ours
    if credentials_file:
        env["GOOGLE_APPLICATION_CREDENTIALS"] = credentials_file
    return env


def run_ray(args: list[str], env: dict[str, str], log: Path, progress: Callable[[str], None],
            timeout: float = RAY_TIMEOUT_S) -> int:
    """Run Ray's CLI, copying its output to `log` and each line to `progress`.

    A watchdog ends it after `timeout` seconds (exit code -15 and a last log line saying so): a
    `ray up` that waits forever for SSH must not hold the cluster's lock forever.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, errors="replace")
        watchdog = threading.Timer(timeout, process.terminate)
        watchdog.start()
        assert process.stdout is not None
        try:
            for line in process.stdout:
                out.write(line)
                out.flush()
                if line.strip():
                    progress(line.strip()[:150])
            code = process.wait()
            if not watchdog.is_alive() and code < 0:
                out.write(f"rayfleet: stopped `{' '.join(args[:2])}` after {timeout:g} s\n")
            return code
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.terminate()
                process.wait()


# Patterns in Ray's output, most specific first: (regex, error class, what to do).
_FAILURES: list[tuple[re.Pattern[str], type[GcpError], str]] = [
    (re.compile(r"RefreshError|invalid_grant|Reauthentication is needed"),
     GcpCredentialsError, "Google refused the credentials (revoked or expired): run `gcloud auth "
                          "application-default login` or download a new key for credentials_file:"),
    (re.compile(r"QUOTA_EXCEEDED|quotaExceeded|Quota '[^']+' exceeded|[Qq]uota exceeded"),
     GcpQuotaError, "free some or request more quota, or lower min_workers"),
    # Rate limits come as RESOURCE_EXHAUSTED too (gRPC's code for both): they are no stockout,
    # and another zone would not help.
    (re.compile(r"RATE_LIMIT_EXCEEDED|rateLimitExceeded|Rate Limit Exceeded|"
                r"RESOURCE_EXHAUSTED.*(rate|per minute|requests)", re.I),
     GcpError, "Google's rate limit for API requests; wait a minute and retry"),
    (re.compile(r"ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources|no more capacity|"
                r"RESOURCE_EXHAUSTED|stockout", re.I),
     GcpError, "Google has no capacity for it now; try another zone or later"),
    (re.compile(r"SERVICE_DISABLED|has not been used in project|accessNotConfigured"),
     GcpApiDisabledError, "enable the API the message names (`gcloud services enable ...`)"),
    (re.compile(r"PERMISSION_DENIED|Permission '[^']+' denied|[Pp]ermission denied|HttpError 403"),
     GcpPermissionError, "your account needs Compute Admin, TPU Admin, Service Account Admin and "
                         "Project IAM Admin (Ray creates a service account for the head)"),
]


#: The reason `failure` gives a run that Google refused for capacity (a stockout).
CAPACITY_REASON = "ZONE_RESOURCE_POOL_EXHAUSTED"


def is_capacity(exc: Exception) -> bool:
    """Whether a failed `ray up` was Google running out of capacity in the zone (another zone
    may have it), as opposed to quota, credentials or a broken config (no other zone helps)."""
    return isinstance(exc, GcpError) and getattr(exc, "reason", "") == CAPACITY_REASON


def failure(verb: str, code: int, log: Path) -> GcpError:
    """A one-line error for a failed `ray <verb>`, from the most telling line of its log."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    for pattern, error_class, fix in _FAILURES:
        hit = next((line for line in reversed(lines) if pattern.search(line)), None)
        if hit is not None:
            return error_class(f"gcp-tpu: `ray {verb}` failed: {_short(hit)}; {fix}; full log: {log}",
                               reason=pattern.pattern.split("|")[0])
    last = _short(lines[-1]) if lines else "no output"
    return GcpError(f"gcp-tpu: `ray {verb}` exited {code}: {last}; full log: {log}")


def _short(line: str, limit: int = 240) -> str:
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"

"""Our jobs in Slurm's queue: how they are named and marked, and squeue's answers, parsed.

Standard library only (plus infra.core.errors and infra.node.identity): both this machine (through a
`Runner`) and the head's autoscaler (node_provider.py, on a compute node without rayfleet's
dependencies) read the queue with these functions.

Every job rayfleet submits carries the cluster id twice: in its name (`rf-<cluster>-<id>-...`)
and in its `--comment` (`rayfleet-cluster=<id>,rayfleet-owner=...,rayfleet-name=...,role=...`).
Only a job whose comment carries this cluster's id is ever adopted, listed as ours or cancelled.

A failed squeue (slurmctld restarting, a timeout) is `QueueUnavailable`, never an empty queue:
reading it as "the job is gone" would cancel or replace a job that is queued or running. Every
caller, here and on the head, waits out an unanswering controller with `patiently`: one policy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from infra.node.errors import ProviderError
from infra.node.identity import TAG_CLUSTER, TAG_NAME, TAG_OWNER
from infra.node.wait import retry

#: squeue's fields, fixed with -o so that a site's SQUEUE_FORMAT cannot change them. The comment
#: comes last; ours never contains "|".
ROW_FORMAT = "%i|%T|%r|%N|%M|%l|%P|%L|%j|%k"
_FIELDS = ROW_FORMAT.count("|") + 1
#: Marks the exit code after squeue's output (stderr merged), see `command`.
_RC = "@@rayfleet-rc="
#: squeue states in which the job still holds (or waits for) nodes.
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING",
               "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"}
#: The comment key for the job's part of the cluster ("head" or "worker") and its worker type.
ROLE = "role"
NODE_TYPE = "type"
#: The launch request of Ray's autoscaler that made a worker job (it matches jobs to requests).
REQUEST = "request"
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class SlurmError(ProviderError):
    """A Slurm command failed or the job did not come up; `job_id` when one is concerned."""

    def __init__(self, message: str, job_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class QueueUnavailable(SlurmError):
    """squeue (or scontrol) failed: the queue's content is unknown, not empty."""


T = TypeVar("T")
#: Messages of Slurm's commands while the controller restarts or is overloaded.
TRANSIENT = re.compile(r"Unable to contact slurm controller|Socket timed out|Zero Bytes|"
                       r"Connection refused|Resource temporarily unavailable|try again|"
                       r"slurm_load_|Slurm backup controller in standby", re.IGNORECASE)
#: The retry policy for a controller that does not answer: waits of 0.5 s doubling up to 8 s,
#: for PATIENCE_S in all (a slurmctld restart takes well under a minute).
FIRST_DELAY_S, MAX_DELAY_S, PATIENCE_S = 0.5, 8.0, 90.0
#: The budget of a caller that asks again on its next round anyway and must not stall that
#: round (Ray's autoscaler calling the node provider keeps its last known jobs meanwhile).
ROUND_PATIENCE_S = 10.0


def patiently(call: Callable[[], T], what: str, patience: float = PATIENCE_S) -> T:
    """`call()`, retried with backoff while Slurm's controller does not answer (QueueUnavailable,
    or a transient failure of scontrol/sbatch/scancel); after `patience` seconds, a
    QueueUnavailable naming `what`. Standard library only: the head runs it too."""
    def transient(exc: BaseException) -> bool:
        return isinstance(exc, QueueUnavailable) or bool(TRANSIENT.search(str(exc)))

    try:
        return retry(call, (SlurmError,), patience=patience, passing=transient,
                     backoff=lambda attempt: min(FIRST_DELAY_S * 2 ** attempt, MAX_DELAY_S))
    except SlurmError as exc:
        if transient(exc):
            raise QueueUnavailable(f"{exc} (for {patience:.0f}s while {what}); "
                                   "is slurmctld answering? Try again later") from None
        raise


def time_limit_seconds(text: str) -> int:
    """Seconds in a Slurm time string (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S); UNLIMITED is huge."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return 2**31
    match = _TIME.fullmatch(text)
    if not match:
        raise ValueError(f"not a Slurm time {text!r}")
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if days is not None:  # D-H, D-H:M, D-H:M:S
        return days * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0)
    if b is None:  # M
        return (a or 0) * 60
    if c is None:  # M:S
        return (a or 0) * 60 + b
    return (a or 0) * 3600 + b * 60 + c  # H:M:S


def slurm_time(seconds: int) -> str:
    """Seconds as Slurm's D-HH:MM:SS (sbatch --time)."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    return f"{days}-{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def job_prefix(cluster: str, cluster_id: str) -> str:
    """The start of every job name of the cluster; the id makes look-alikes distinguishable."""
    return f"rf-{cluster}-{cluster_id}-"


def comment(cluster_id: str, owner: str, cluster: str, role: str, **extra: str) -> str:
    """The --comment of a job of ours (no spaces, no quotes: safe as one shell word)."""
    pairs = {TAG_CLUSTER: cluster_id, TAG_OWNER: owner, TAG_NAME: cluster, ROLE: role, **extra}
    return ",".join(f"{key}={value}" for key, value in pairs.items())


def parse_comment(text: str) -> dict[str, str]:
    pairs = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep:
            pairs[key.strip()] = value.strip()
    return pairs


@dataclass(frozen=True)
class JobRow:
    """One line of squeue (one per component of a heterogeneous job)."""

    job_id: str
    state: str
    reason: str
    nodes: str
    elapsed: str
    limit: str
    partition: str
    time_left: str
    name: str
    comment: str

    @property
    def tags(self) -> dict[str, str]:
        return parse_comment(self.comment)

    @property
    def base_id(self) -> str:
        """The job id without a heterogeneous component (`42+1` -> `42`)."""
        return self.job_id.split("+")[0].split("_")[0]

    def ours(self, cluster_id: str) -> bool:
        return self.tags.get(TAG_CLUSTER) == cluster_id

    @property
    def seconds_left(self) -> int | None:
        try:
            return time_limit_seconds(self.time_left)
        except ValueError:  # NOT_SET, INVALID: unknown
            return None


def parse_rows(text: str) -> list[JobRow]:
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|", _FIELDS - 1)
        if len(parts) == _FIELDS and parts[0][:1].isdigit():
            rows.append(JobRow(*parts))
    return rows


def command(arguments: str) -> str:
    """An squeue command line whose answer `parse` can tell apart: rows, gone, or failed."""
    return f"{{ squeue -h {arguments} -o '{ROW_FORMAT}'; echo \"{_RC}$?\"; }} 2>&1"


def argv(*arguments: str) -> list[str]:
    """squeue's argv for `parse_result` (no shell: a shell may source BASH_ENV and stall)."""
    return ["squeue", "-h", *arguments, "-o", ROW_FORMAT]


def parse_result(stdout: str, stderr: str, code: int, what: str) -> list[JobRow]:
    """`parse` for an squeue run without the shell wrapper of `command`."""
    return parse(f"{stdout}\n{stderr}\n{_RC}{code}\n", what)


def parse(text: str, what: str) -> list[JobRow]:
    """The rows of an answer to `command`; QueueUnavailable if squeue failed.

    squeue exits 1 with "Invalid job id specified" once a job's record is purged (MinJobAge):
    that is an empty answer, like exit 0 with no rows. Any other failure is not.
    """
    body, _, code = text.rpartition(_RC)
    if not _:
        raise QueueUnavailable(f"squeue ({what}) gave no answer: {text.strip()[-200:] or 'nothing'}")
    rows = parse_rows(body)
    if code.strip() == "0" or "Invalid job id" in body:
        return rows
    errors = [line.strip() for line in body.splitlines()
              if line.strip() and not parse_rows(line)] or [f"exit {code.strip()}"]
    raise QueueUnavailable(f"squeue ({what}) failed: {errors[-1]}")

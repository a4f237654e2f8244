"""Slurm's client commands, parsed: partitions and nodes, the queue, sbatch, scancel.

Every function takes a `Runner` (this machine or a login host) and returns dataclasses. Output
formats are fixed with `-o`/`--oneliner` so that a site's SQUEUE_FORMAT cannot change them.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field

from infra.core.errors import SpecError
from infra.node import shell
from infra.node.slurm import queue
from infra.node.slurm.info import Info
from infra.node.slurm.queue import LIVE_STATES, JobRow, QueueUnavailable, patiently
from infra.node.where import home_path
from infra.node.wire import WireError
from infra.providers.slurm.remote import Runner, SlurmError
from infra.providers.slurm.spec import Spec, time_limit_seconds

__all__ = ["LIVE_STATES", "JobRow", "QueueUnavailable", "patiently"]

_SPLIT = "@@rayfleet@@"


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int
    state: str


@dataclass
class Partition:
    name: str
    default: bool = False
    state: str = "UP"
    total_nodes: int = 0
    max_nodes: int | None = None
    max_time_s: int = 2**31
    max_time: str = "UNLIMITED"
    nodes: list[Node] = field(default_factory=list)


@dataclass
class Poll:
    """What one round trip tells about a job: queue rows, pending queue, the info file."""

    rows: list[JobRow] | None
    pending: list[str]
    info: Info | None


def _gpus(gres: str) -> int:
    """GPU count from sinfo's %G, e.g. "gpu:a100:4(S:0-1),shard:8" -> 4."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _int(text: str, default: int = 0) -> int:
    match = re.match(r"\d+", text)
    return int(match.group()) if match else default


def partitions(runner: Runner) -> dict[str, Partition]:
    """Every partition with its limits and nodes (one command line, one round trip)."""
    out = patiently(lambda: runner.check(shell.all_of(
        shell.argv("scontrol", "show", "partition", "--oneliner"), shell.argv("echo", _SPLIT),
        shell.argv("sinfo", "-h", "-N", "-o", "%R|%N|%c|%m|%G|%t"))), "reading the partitions")
    part_text, _, node_text = out.partition(_SPLIT)
    found: dict[str, Partition] = {}
    for line in part_text.splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if "PartitionName" not in fields:
            continue
        max_nodes = fields.get("MaxNodes", "UNLIMITED")
        max_time = fields.get("MaxTime", "UNLIMITED")
        try:
            max_time_s = time_limit_seconds(max_time)
        except ValueError:
            max_time_s = 2**31
        found[fields["PartitionName"]] = Partition(
            name=fields["PartitionName"], default=fields.get("Default") == "YES",
            state=fields.get("State", "UP"), total_nodes=_int(fields.get("TotalNodes", "0")),
            max_nodes=None if not max_nodes.isdigit() else int(max_nodes),
            max_time_s=max_time_s, max_time=max_time)
    for line in node_text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6 or parts[0] not in found:
            continue
        name, node, cpus, memory, gres, state = parts
        found[name].nodes.append(Node(node, _int(cpus), _int(memory), _gpus(gres), state))
    return found


def _fail(spec: Spec, key: str, message: str) -> SpecError:
    return SpecError(f"{spec.source}: {key}: {message}")


def _check_group(spec: Spec, key: str, part: Partition, nodes: int, cpus: int, gpus: int,
                 memory_mb: int | None, also_used: int = 0) -> None:
    """Could this partition ever run `nodes` nodes of this shape? SpecError if not."""
    prefix = f"{key}." if key else ""
    where = f"partition {part.name!r}"
    if nodes + also_used > part.total_nodes:
        wanted = f"{nodes + also_used} nodes in all" if also_used else f"{nodes} nodes"
        raise _fail(spec, f"{prefix}nodes", f"{wanted} requested but {where} has "
                    f"{part.total_nodes}; lower it or pick a bigger partition")
    if part.max_nodes is not None and nodes > part.max_nodes:
        raise _fail(spec, f"{prefix}nodes", f"{nodes} nodes requested but {where} allows "
                    f"{part.max_nodes} per job; lower it or pick another partition")
    checks = [("cpus_per_node", cpus, lambda n: n.cpus, "CPUs"),
              ("gpus_per_node", gpus, lambda n: n.gpus, "GPUs"),
              ("memory_per_node_mb", memory_mb or 0, lambda n: n.memory_mb, "MB of memory")]
    for field_name, wanted_each, have, unit in checks:
        if not part.nodes or wanted_each == 0:
            continue
        fitting = sum(1 for n in part.nodes if have(n) >= wanted_each)
        if fitting == 0:
            best = max(have(n) for n in part.nodes)
            raise _fail(spec, f"{prefix}{field_name}",
                        f"{wanted_each} {unit} per node requested but no node of {where} has "
                        f"that many (the largest has {best}); lower it or pick another partition")
        if fitting < nodes:
            raise _fail(spec, f"{prefix}{field_name}",
                        f"{nodes} nodes with {wanted_each} {unit} each requested but only "
                        f"{fitting} node(s) of {where} have that many; lower it or pick another "
                        "partition")
    if time_limit_seconds(spec.time_limit) > part.max_time_s:
        raise _fail(spec, "time_limit", f"{spec.time_limit} exceeds the MaxTime {part.max_time} "
                    f"of {where}; shorten it")


def _pick(spec: Spec, key: str, name: str | None, found: dict[str, Partition],
          where: str) -> Partition:
    if name is None:
        default = next((p for p in found.values() if p.default), None)
        if default is None:
            raise _fail(spec, key, f"{where} has no default partition; set {key} to one of "
                        f"{', '.join(sorted(found))}")
        return default
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise _fail(spec, key, f"unknown partition {name!r} on {where}; {hint}choose one of "
                    f"{', '.join(sorted(found)) or '(none)'}")
    return found[name]


def check_spec(spec: Spec, found: dict[str, Partition], where: str) -> list[str]:
    """Validate the spec against the cluster's partitions; return notes (warnings) for the plan."""
    main = _pick(spec, "partition", spec.partition, found, where)
    _check_group(spec, "", main, spec.nodes, spec.cpus_per_node, spec.gpus_per_node,
                 spec.memory_per_node_mb)
    notes = []
    used = {main.name: spec.nodes}
    gpu = spec.gpu_workers
    if gpu:
        part = _pick(spec, "gpu_workers.partition", gpu.partition or spec.partition, found, where)
        _check_group(spec, "gpu_workers", part, gpu.nodes, gpu.cpus_per_node, gpu.gpus_per_node,
                     gpu.memory_per_node_mb, also_used=used.get(part.name, 0))
        used[part.name] = used.get(part.name, 0) + gpu.nodes
    for name in used:
        part = found[name]
        if part.state != "UP":
            notes.append(f"partition {name!r} is {part.state}: the job will wait until it is UP")
        usable = [n for n in part.nodes if not re.match(r"(down|drain|fail|maint)", n.state)]
        if len(usable) < used[name]:
            notes.append(f"partition {name!r} has {len(usable)} usable nodes now (others down or "
                         f"draining); the job waits until {used[name]} are")
    return notes


def _job_command(job_id: str) -> str:
    return queue.command(f"-j {shlex.quote(job_id)}")


def job_rows(runner: Runner, job_id: str) -> list[JobRow] | None:
    """The job's queue rows, or None once it has left the queue; QueueUnavailable if squeue
    failed (the job's fate is then unknown, never "gone")."""
    out = runner.run(_job_command(job_id), timeout=30).stdout
    return queue.parse(out, f"job {job_id}") or None


def job_file(workdir: str, job_name: str, suffix: str) -> str:
    """A file of the job in the work dir, in shell form (it may start with "$HOME"): the batch
    script writes <job name>.json (the info file) and Slurm <job name>.out (its output)."""
    return home_path(f"{workdir.rstrip('/')}/{job_name}{suffix}")


def poll(runner: Runner, job_id: str, info_file: str, partition: str | None,
         position: bool = True) -> Poll:
    """Queue rows, the pending queue of the partition (for a position; only with `position`),
    the info file: one trip. QueueUnavailable when squeue failed."""
    part = f"-p {shlex.quote(partition)} " if partition else ""
    pending = f"squeue -h -t PENDING {part}-o %i --sort=-p,i 2>/dev/null; " if position else ""
    out = runner.run(
        f"{_job_command(job_id)}; echo {_SPLIT}; {pending}echo {_SPLIT}; "
        f"cat {info_file} 2>/dev/null", timeout=30).stdout
    rows_text, _, rest = out.partition(_SPLIT)
    pending_text, _, info_text = rest.partition(_SPLIT)
    info: Info | None = None
    if info_text.strip():
        try:
            info = Info.from_json(info_text)
        except ValueError:
            info = None  # caught between writes on a file system without atomic rename: retry
    rows = queue.parse(rows_text, f"job {job_id}")
    return Poll(rows or None, pending_text.split(), info)


def read_info(runner: Runner, info_file: str) -> Info | None:
    text = runner.run(f"cat {info_file} 2>/dev/null", timeout=30).stdout
    try:
        return Info.from_json(text) if text.strip() else None
    except (ValueError, WireError):
        return None  # teardown goes on with what state recorded of the job


def _write_secret(folder: str, name: str, size: int) -> str:
    """Shell that writes the first `size` characters of stdin to folder/name: 0700 dir, 0600 file,
    renamed into place. `read -N` on a pipe takes exactly those bytes (bash reads pipes a byte at
    a time), so the rest of stdin is left for the next command; the secret is never on a command
    line (printf is a builtin). In a subshell: the umask must not reach sbatch and the job."""
    # `folder` is already one shell word (ours.token_dir, "$HOME"/... kept expanding).
    where = shell.Shell(folder)
    tmp = shell.Shell(f"{where}/{shell.word(name + '.tmp')}")
    final = shell.Shell(f"{where}/{shell.word(name)}")
    return shell.subshell(shell.all_of(
        "umask 077", shell.argv("mkdir", "-p", where), shell.argv("chmod", "700", where),
        f"IFS= read -r -N {int(size)} rf_secret", f"printf '%s' \"$rf_secret\" > {tmp}",
        shell.argv("chmod", "600", tmp), shell.argv("mv", "-f", tmp, final)))


def sbatch(runner: Runner, workdir: str, job_name: str, script: str, comment: str,
           export: dict[str, str] | None = None,
           secrets: tuple[str, dict[str, str]] | None = None) -> str:
    """Submit `script` (on stdin) from `workdir` with our name and comment; return the job id.
    `export`: extra variables for the job (names and values are not secrets: they are visible
    to every user in `scontrol show job`). `secrets`: (folder, name -> content) of the files the
    nodes read (the Ray token, the MLflow login), written first in the same round trip (ahead of
    the script on stdin)."""
    folder = shell.Shell(home_path(workdir))
    exports = "".join(f",{k}={v}" for k, v in (export or {}).items())
    writes: list[str] = []
    stdin = script
    if secrets is not None and secrets[1]:
        names = sorted(secrets[1])
        writes = [_write_secret(secrets[0], name, len(secrets[1][name])) for name in names]
        stdin = "".join(secrets[1][name] for name in names) + script
    out = runner.check(shell.all_of(
        *writes, shell.argv("mkdir", "-p", folder), shell.argv("cd", folder),
        shell.argv("sbatch", "--parsable", f"--job-name={job_name}", f"--comment={comment}",
                   f"--export=ALL{exports}")), input=stdin)
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch on {runner.where} printed {out.strip()!r}, not a job id")
    return job_id


def our_jobs(runner: Runner, cluster_id: str) -> list[JobRow]:
    """Every job of this user whose comment carries the cluster id (head and workers alike)."""
    out = runner.run(queue.command('-u "$(id -un)"'), timeout=30).stdout
    return [row for row in queue.parse(out, "this user's jobs") if row.ours(cluster_id)]


def pending_queue(runner: Runner) -> list[str]:
    """Ids of every pending job in scheduling order (priority, then id): for queue positions."""
    result = runner.run("squeue -h -t PENDING -o %i --sort=-p,i", timeout=30)
    if not result.ok:
        raise QueueUnavailable(f"squeue (pending jobs) failed: "
                               f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    return [line.split("+")[0].split("_")[0] for line in result.stdout.split()]


def lookalikes(runner: Runner, prefix: str, cluster_id: str) -> list[JobRow]:
    """This user's jobs named like the cluster's but not carrying its id (never touched)."""
    out = runner.run(queue.command('-u "$(id -un)"'), timeout=30).stdout
    return [row for row in queue.parse(out, "this user's jobs")
            if row.name.startswith(prefix) and not row.ours(cluster_id)]


def find_by_name(runner: Runner, job_name: str, cluster_id: str | None) -> list[str]:
    """Ids of this user's jobs named `job_name` (a submission whose id we never read) that carry
    the cluster id in their comment (`cluster_id` None: a job from before ids, name only)."""
    out = runner.run(queue.command(f'-u "$(id -un)" --name={shlex.quote(job_name)}'),
                     timeout=30).stdout
    rows = queue.parse(out, f"jobs named {job_name}")
    return sorted({r.base_id for r in rows if cluster_id is None or r.ours(cluster_id)})


def scancel(runner: Runner, job_id: str) -> None:
    result = runner.run(f"scancel {shlex.quote(job_id)}", timeout=60)
    if not result.ok and "Invalid job id" not in result.stderr and "already completing" not in (
            result.stderr):
        lines = result.stderr.strip().splitlines() or ["no output"]
        raise SlurmError(f"scancel {job_id} on {runner.where}: {lines[-1]}", job_id)


def open_ports(runner: Runner, targets: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Which of these ip:port still accept TCP connections, tested from where Slurm runs."""
    if not targets:
        return []
    words = shell.argv(*(f"{ip}/{port}" for ip, port in targets))
    out = runner.run(
        f"for t in {words}; do timeout 1 bash -c \"exec 3<>/dev/tcp/$t\" 2>/dev/null "
        "&& echo \"$t\"; done; true", timeout=10 + 2 * len(targets)).stdout
    still = set(out.split())
    return [(ip, port) for ip, port in targets if f"{ip}/{port}" in still]


def read_output(runner: Runner, path: str) -> str:
    return runner.run(f"cat {path} 2>/dev/null", timeout=60).stdout


def remove_files(runner: Runner, workdir: str, job_name: str) -> None:
    base = home_path(f"{workdir.rstrip('/')}/{job_name}")
    # The atomic write's temporary files (infra/node/files.py), should a writer have died.
    hidden = home_path(f"{workdir.rstrip('/')}/.{job_name}")
    # <job name>.autodown.json: what the head's idle watcher left when it removed the cluster.
    runner.run(f"rm -f {base}.json {base}.out {base}.json.tmp* {base}.autodown.json* "
               f"{hidden}.json.*.tmp {hidden}.autodown.json.*.tmp", timeout=30)

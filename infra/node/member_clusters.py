"""Member clusters (`sharing.isolation: cluster`): each member's own Ray head, run for the gateway.

The gateway (unprivileged) holds one `MemberClusters`: on a member's request it makes sure their
cluster runs, asking the privileged starter (infra/node/member_starter.py, one verb, `sudo -n`
unless the gateway already runs as root) through one command line; the request waits up to
`START_WAIT_S`, then is answered 503 "your cluster is starting" while the start goes on. At most
`max_active_members` run at once (one more: 503 saying so). Every `POLL_S` it asks each running
cluster whether it is busy (autodown.busy_reasons: jobs, drivers, tasks, actors) and stops one
idle for `member_idle_minutes` (its processes end, its files stay); `remove` (a member removed or
expired) deletes everything of theirs. Written once for every head: the starter is the only part
that touches the machine. Standard library and what Ray brings (node rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import re
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from infra.node import member_usage as mu
from infra.node.files import atomic_write
from infra.node.wait import WaitTimeout, until_async

#: How long a member's request waits for their cluster to start before a one-line 503.
START_WAIT_S = 60.0
#: Seconds between two idle checks of the running member clusters.
POLL_S = 30.0
CONFIG_FILE = "member-clusters.json"


@dataclass(frozen=True)
class StarterConfig:
    """What the starter may do, written by `up` (infra/core/sharing/isolation.py), root's 0600."""

    cluster: str
    #: Where the 0700 parent dirs go (`<tmp_root>/rf-m-<id>`): short, as Ray's socket paths
    #: under the temp dir must stay under 108 bytes.
    tmp_root: str
    #: The gateway's own copies of member tokens (0600, the gateway's user), in a dir root owns
    #: and only the gateway's group may read (the starter makes it so).
    token_dir: str
    gateway_uid: int
    gateway_gid: int
    #: The folder of the Python (with Ray) that member users run; they must be able to enter it.
    #: Empty: the folder of the Python the starter runs with (a head's installed starter).
    python_bin: str
    #: Member port blocks: `first_port`, every `block_step`, up to `last_port`.
    first_port: int = 32000 - 128 * 16
    last_port: int = 32000 - 128
    block_step: int = 128
    #: 0 (here and in the two limits below): the head machine's, read there (on_this_machine).
    num_cpus: int = 1
    #: The cgroup limits of each member's processes on the head machine.
    cpus: float = 1.0
    memory_mb: int = 4096
    object_store_mb: int = 128
    start_timeout_s: float = 90.0
    max_active_members: int = 8
    member_idle_minutes: float = 20.0
    #: The starter's command prefix; empty when the gateway runs as root.
    sudo: list[str] = field(default_factory=list)
    #: The gateway's Unix user by name (a cloud head's, unknown where `up` writes this): when
    #: set, the starter takes its uid and gid from the head's user table, not the two above.
    gateway_user: str = ""
    #: The starter's whole command line before its verb, where it is installed on the head as a
    #: root-owned command with its own copy of this config (setup/users/users.sh `starter:`,
    #: the one sudoers rule): then neither `sudo` nor this file's path are used to call it.
    command: list[str] = field(default_factory=list)


def on_this_machine(config: StarterConfig) -> StarterConfig:
    """`config` with what `up` left to the head (0: not known where it was written) taken from
    this machine: every CPU for each member (as the local provider without `num_cpus`), and 80%
    of the memory shared among `max_active_members`."""
    if config.num_cpus > 0 and config.memory_mb > 0:
        return config
    cpus = config.num_cpus or os.cpu_count() or 1
    try:
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        total_mb = 8192
    memory = config.memory_mb or max(1024, int(total_mb * 0.8) // config.max_active_members)
    return replace(config, num_cpus=cpus, cpus=config.cpus or float(cpus), memory_mb=memory)


def short_id(member_id: str) -> str:
    """The part of a member id that names their user and dirs: a random id as it is, any other
    (legacy ids carry the member's name) hashed, so no name reaches a path or a user name."""
    if re.fullmatch(r"[0-9a-f]{1,16}", member_id):
        return member_id
    return hashlib.sha256(member_id.encode()).hexdigest()[:16]


def member_user(member_id: str) -> str:
    """The Unix user of a member's cluster."""
    return f"rf-m-{short_id(member_id)}"


def write_starter_config(path: Path, config: StarterConfig) -> None:
    atomic_write(path, json.dumps(asdict(config), indent=2), mode=0o600)


def read_starter_config(path: Path) -> StarterConfig:
    data = json.loads(path.read_text())
    return on_this_machine(
        StarterConfig(**{f.name: data[f.name] for f in fields(StarterConfig) if f.name in data}))


@dataclass
class Running:
    port_base: int
    dashboard_port: int
    #: When it was last seen busy (or started), time.monotonic().
    busy_at: float


class Full(Exception):
    """`max_active_members` clusters run; the text is the member's one line."""


class Starting(Exception):
    """The cluster did not answer within START_WAIT_S; its start goes on."""


class Refused(Exception):
    """A budget is used up (member_usage.py); the text is the member's one line."""


class MemberClusters:
    def __init__(self, config_path: str, limits: mu.Limits | None = None,
                 usage_dir: str = "") -> None:
        self.config_path = config_path
        self.config = read_starter_config(Path(config_path))
        #: Each member cluster's state and usage, kept beside the gateway's own usage.
        self.usage = mu.MemberUsage(
            Path(usage_dir or Path(self.config.token_dir).parent) / mu.USAGE_FILE,
            limits or mu.Limits(), mu.machine_share(self.config.cpus))
        self.running: dict[str, Running] = {}
        self.starts: dict[str, asyncio.Task[Running]] = {}
        #: The port block of each start under way: two starts at once must not pick the same.
        self.reserved: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None

    def token(self, member_id: str) -> str | None:
        try:
            return (Path(self.config.token_dir) / f"{short_id(member_id)}.token").read_text().strip()
        except OSError:
            return None

    def token_path(self, member_id: str) -> str:
        return str(Path(self.config.token_dir) / f"{short_id(member_id)}.token")

    async def starter(self, verb: str, member_id: str, *args: str) -> dict[str, Any]:
        """One call of the privileged starter; its JSON answer (an `error` key: it failed)."""
        installed = self.config.command
        argv = [*(installed or [*self.config.sudo, sys.executable, "-m",
                                "infra.node.member_starter", "--config", self.config_path]),
                verb, member_id, *args]
        # This checkout's root holds `infra` (a head's node package is a zip: the installed
        # starter has its own root-owned copy).
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            cwd="/" if installed else str(Path(__file__).resolve().parents[2]))
        out, _ = await process.communicate()
        try:
            answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            answer = {"error": f"the member starter exited {process.returncode}"}
        return answer

    def _free_block(self) -> int:
        from infra.node import rayproc

        used = {r.port_base for r in self.running.values()} | set(self.reserved.values())
        span = (self.config.last_port - self.config.first_port) // self.config.block_step + 1
        first = zlib.crc32(self.config.cluster.encode()) % span
        for i in range(span):
            base = self.config.first_port + ((first + i) % span) * self.config.block_step
            if base not in used and rayproc.block_is_free(rayproc.PortBlock(base)):
                return base
        raise Full("no free port block for another member cluster on the head; try later")

    async def _start(self, member_id: str, base: int) -> Running:
        answer = await self.starter("start", member_id, str(base))
        if "error" in answer:
            raise RuntimeError(str(answer["error"]))
        entry = Running(base, int(answer["dashboard_port"]), time.monotonic())
        await self._wait_answers(entry.dashboard_port, member_id)
        return entry

    async def _wait_answers(self, port: int, member_id: str) -> None:
        """Until the member's dashboard answers its job API (what `ray job submit` needs)."""
        from aiohttp import ClientSession, ClientTimeout

        headers = {"Authorization": f"Bearer {self.token(member_id) or ''}"}
        async with ClientSession(timeout=ClientTimeout(total=5)) as session:

            async def answers() -> bool:
                with contextlib.suppress(Exception):
                    async with session.get(f"http://127.0.0.1:{port}/api/jobs/",
                                           headers=headers) as answer:
                        return answer.status == 200
                return False

            try:
                await until_async(answers, self.config.start_timeout_s, 0.25,
                                  "the member's dashboard")
            except WaitTimeout:
                raise RuntimeError("the member's dashboard did not answer") from None

    async def reach(self, member_id: str, wait_s: float = START_WAIT_S) -> Running:
        """The member's running cluster, started if need be. Raises Full or Starting (one line
        for the member), RuntimeError when the start failed."""
        async with self._lock:
            refused = self.usage.refusal(member_id)
            if refused:  # a running one stops at the next idle check
                raise Refused(refused)
            entry = self.running.get(member_id)
            if entry is not None:
                entry.busy_at = max(entry.busy_at, time.monotonic() - 0.0)
                return entry
            task = self.starts.get(member_id)
            if task is None:
                if len(self.running) + len(self.starts) >= self.config.max_active_members:
                    raise Full(f"all {self.config.max_active_members} member clusters of this "
                               "class run now (sharing.max_active_members); try again in a few "
                               "minutes")
                base = self.reserved[member_id] = self._free_block()
                task = asyncio.create_task(self._start(member_id, base))
                self.starts[member_id] = task
                task.add_done_callback(functools.partial(self._started, member_id))
        try:
            return await asyncio.wait_for(asyncio.shield(task), wait_s)
        except asyncio.TimeoutError:
            raise Starting("your cluster is starting; try again in a minute") from None

    def _started(self, member_id: str, task: asyncio.Task[Running]) -> None:
        self.starts.pop(member_id, None)
        self.reserved.pop(member_id, None)
        if not task.cancelled() and task.exception() is None:
            self.running[member_id] = task.result()
            self.usage.started(member_id)

    async def stop(self, member_id: str, reason: str = "idle") -> None:
        """Its processes gone, its files kept (idle, budget end)."""
        self.running.pop(member_id, None)
        self.usage.stopped(member_id, reason)
        await self.starter("stop", member_id)

    async def remove(self, member_id: str) -> None:
        """Everything of theirs gone (removed, expired)."""
        self.running.pop(member_id, None)
        self.usage.stopped(member_id, "removed")
        await self.starter("remove", member_id)

    async def idle_check(self, current_ids: set[str]) -> None:
        """Stop clusters idle past `member_idle_minutes`; remove those of members gone."""
        from infra.node.autodown import busy_reasons

        now = time.monotonic()
        # Every member cluster ever started has its token copy here, whichever gateway started
        # it: one whose member is gone (removed, expired) is removed, files and user too.
        kept = {p.stem for p in Path(self.config.token_dir).glob("*.token")}
        for gone in sorted(kept - {short_id(m) for m in current_ids}):
            await self.remove(gone)  # a short id names the same member (short_id(gone) == gone)
        for member_id, entry in list(self.running.items()):
            self.usage.accrue(member_id, time.time())
            refused = self.usage.refusal(member_id)
            if refused:
                await self.stop(member_id, refused)
                continue
            with contextlib.suppress(Exception):  # not answering: the busy check below says
                await self.enforce_hours(member_id, entry)
            try:
                busy = await asyncio.to_thread(busy_reasons, f"http://127.0.0.1:"
                                               f"{entry.dashboard_port}", self.token_path(member_id))
            except Exception:  # not answering: its processes are gone or going; stop them
                busy = []
            if busy:
                entry.busy_at = now
            elif now - entry.busy_at >= self.config.member_idle_minutes * 60:
                await self.stop(member_id)
        self.usage.save()  # what `members` and `status` read: accrued to this check

    async def enforce_hours(self, member_id: str, entry: Running) -> None:
        """Stop every job of the member's cluster past `max_job_hours`: all of its jobs are
        theirs (their Unix user's), whatever a job's metadata or environment say."""
        limit = self.usage.limits.max_job_hours
        if limit is None:
            return
        url, token = f"http://127.0.0.1:{entry.dashboard_port}", self.token_path(member_id)
        jobs = await asyncio.to_thread(mu.list_jobs, url, token)
        for job_id in mu.overdue(jobs, limit):
            await asyncio.to_thread(mu.stop_job, url, token, job_id)
            print(f"member clusters: stopped job {job_id} of member {short_id(member_id)}: "
                  f"past sharing.max_job_hours ({limit:g} h)", flush=True)

    async def watch(self, current_ids: Any) -> None:
        """`current_ids()`: the ids of members who may still act (the gateway's members file).
        First, clusters a previous gateway left running are stopped: this one knows none of
        their ports, and a member's next request starts theirs again."""
        for kept in sorted(p.stem for p in Path(self.config.token_dir).glob("*.token")):
            if kept not in {short_id(m) for m in [*self.running, *self.starts]}:
                with contextlib.suppress(Exception):
                    await self.starter("stop", kept)
        self.usage.close_stale({*self.running, *self.starts})
        while True:
            await asyncio.sleep(min(POLL_S, self.config.member_idle_minutes * 30))
            try:
                await self.idle_check(current_ids())
            except Exception as exc:  # said, and tried again: never the end of idle stops
                print(f"member clusters: an idle check failed ({type(exc).__name__}: "
                      f"{exc!s:.200}); trying again in {POLL_S:g} s", flush=True)

    def start_watch(self, current_ids: Any) -> None:
        self._watcher = asyncio.create_task(self.watch(current_ids))

    async def shutdown(self) -> None:
        """The gateway stops (teardown): every member cluster's processes go with it."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        # Together: the supervisor's grace before SIGKILL is 5 s (supervise.stop).
        await asyncio.gather(*(self.stop(m, "the gateway stopped") for m in list(self.running)),
                             return_exceptions=True)


def gateway_runs_as_root() -> bool:
    return os.geteuid() == 0

"""The one supervisor of every daemon on a cluster's head (the idle watcher, the MLflow tracking
server, GCP's queued-slice joiner, and whatever else a head runs beside Ray).

`python -m infra.node.supervise run --pidfile P [--restart POLICY] -- ARGV...` runs ARGV as its
child and starts it again, after a short pause, whenever it ends unasked. What counts as unasked
is the daemon's restart policy:
- `on-failure` (the default): any end but exit 0 (a crash, `kill -9`, the OOM killer). Exit 0
  means the daemon finished its work (the watcher removed the cluster): the supervisor then ends
  too.
- `always`: any end at all, exit 0 included (the sharing gateway: it has no work to finish, and a
  gateway that ended would lock every member out until the owner's next `up`).
SIGTERM to the supervisor stops the child and the supervisor, whatever the policy: the one way
to end a daemon under `always` (`stop`, teardown, the end of the head's job).

The pid file P (JSON) names the supervisor and its current child, each by pid *and start time*
(`rayproc.Identity`): a pid the kernel has since handed to another process never passes for the
daemon, so it never stops a restart and is never signalled.

Who restarts the supervisor: `ensure` (what every `up` runs on the head, through
infra/core/remote_head.py or directly on this machine) starts one unless P names a supervisor or a
daemon that still runs; on Slurm the batch script's loop starts it again (see ARCHITECTURE.md).
A supervisor that starts while its predecessor's child still runs (the predecessor was killed
with -9) stops that child first: one daemon per pid file, always.

Standard library and psutil only (Ray's copy of psutil where only Ray is installed: rayproc).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.node.files import atomic_write
from infra.node.rayproc import Identity, terminate
from infra.node.wait import WaitTimeout, until

#: The first pause before a restart; it doubles while the daemon keeps dying young.
FIRST_DELAY_S = 1.0
#: The longest pause: a daemon killed after its first minute is back well within 30 s.
MAX_DELAY_S = 20.0
#: A child that lived this long counts as healthy: the next restart pauses FIRST_DELAY_S again.
HEALTHY_AFTER_S = 60.0
#: The restart policies (see the module's text); the first is the default.
POLICIES = ("on-failure", "always")


def read(pidfile: Path) -> dict[str, Any]:
    """The pid file's content: {"supervisor": Identity|None, "child": Identity|None, "argv": [...]}.
    Anything unreadable (missing, a bare pid from an older version) identifies nothing."""
    try:
        data = json.loads(pidfile.read_text())
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return {"supervisor": None, "child": None, "argv": []}
    return {"supervisor": Identity.from_dict(data.get("supervisor")),
            "child": Identity.from_dict(data.get("child")), "argv": data.get("argv") or []}


def _write(pidfile: Path, me: Identity, child: Identity | None, argv: Sequence[str]) -> None:
    atomic_write(pidfile, json.dumps({"supervisor": me.as_dict(),
                                      "child": child.as_dict() if child else None,
                                      "argv": list(argv)}) + "\n")


def running(pidfile: Path) -> bool:
    """True while the supervisor named in `pidfile`, or the daemon it started, still runs (by
    identity: a recycled pid is not the daemon)."""
    found = read(pidfile)
    return any(ident is not None and ident.running()
               for ident in (found["supervisor"], found["child"]))


def status(pidfile: Path) -> dict[str, Any]:
    """What `status` needs: is the daemon running, is its supervisor, and their pids."""
    found = read(pidfile)
    sup, child = found["supervisor"], found["child"]
    sup_up = sup is not None and sup.running()
    child_up = child is not None and child.running()
    return {"running": sup_up or child_up, "supervisor_running": sup_up,
            "daemon_running": child_up, "pid": child.pid if child_up and child else None}


def stop(pidfile: Path, grace: float = 5.0) -> bool:
    """Stop the supervisor and its daemon (exactly the processes the pid file identifies) and
    remove the pid file; True when something was running."""
    found = read(pidfile)
    targets = [i for i in (found["supervisor"], found["child"]) if i is not None and i.running()]
    if targets:
        terminate(targets, grace=grace)
    pidfile.unlink(missing_ok=True)
    return bool(targets)


def ensure(argv: Sequence[str], pidfile: Path, log: Path, cwd: str | None = None,
           env: dict[str, str] | None = None, python: str = sys.executable,
           wait: bool = True, restart: str = POLICIES[0]) -> bool:
    """Start `argv` supervised, detached from the caller, unless the pid file names a supervisor
    or daemon that still runs; True when it started one. The public "run this argv supervised"
    of this machine (a local head; on a remote head, `remote_head.install_daemon` runs this).
    `wait`: return once the supervisor has written its pid file (so a second `ensure` right after
    sees it), a few hundred ms of start-up; False for a caller that must not wait (`up`'s
    tracking server, which starts beside Ray, bench/tracking_up.py). `restart`: the daemon's
    restart policy (POLICIES)."""
    if restart not in POLICIES:
        raise ValueError(f"restart policy {restart!r}: use one of {', '.join(POLICIES)}")
    if running(pidfile):
        return False
    log.parent.mkdir(parents=True, exist_ok=True)
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    here = str(Path(__file__).resolve().parents[2])
    child_env = dict(os.environ if env is None else env)
    # The supervisor imports this package the way its daemon does; from a source checkout the
    # checkout's root, from a head's zip the zip already on PYTHONPATH.
    if not Path(here).is_file() and here not in child_env.get("PYTHONPATH", "").split(os.pathsep):
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (child_env.get("PYTHONPATH", ""), here) if p)
    with log.open("a") as out:
        subprocess.Popen([python, "-m", "infra.node.supervise", "run", "--pidfile", str(pidfile),
                          "--restart", restart, "--", *argv], cwd=cwd, env=child_env, stdout=out,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    if wait:
        # A failing start leaves the log to say why.
        with contextlib.suppress(WaitTimeout):
            until(lambda: running(pidfile), 10, 0.05, "the supervisor to start")
    return True


class _Supervisor:
    def __init__(self, argv: Sequence[str], pidfile: Path, restart: str = POLICIES[0]) -> None:
        self.argv, self.pidfile, self.restart = list(argv), pidfile, restart
        self.me = Identity.of(os.getpid())
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None

    def _on_term(self, signum: int, _frame: Any) -> None:
        self.stopping.set()
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        assert self.me is not None
        before = read(self.pidfile)
        other = before["supervisor"]
        if other is not None and other.pid != self.me.pid and other.running():
            _log(f"another supervisor (pid {other.pid}) runs {self.pidfile}; leaving it")
            return 0
        if before["child"] is not None and before["child"].running():
            # Our predecessor was killed and its daemon lives on: one daemon per pid file.
            _log(f"stopping the daemon left by an ended supervisor (pid {before['child'].pid})")
            terminate([before["child"]], grace=5.0)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        try:
            return self._loop()
        finally:
            if read(self.pidfile)["supervisor"] == self.me:
                self.pidfile.unlink(missing_ok=True)

    def _loop(self) -> int:
        assert self.me is not None
        delay = FIRST_DELAY_S
        while not self.stopping.is_set():
            started = time.monotonic()
            self.child = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
            _write(self.pidfile, self.me, Identity.of(self.child.pid), self.argv)
            code = self.child.wait()
            if self.stopping.is_set():
                return 0
            if code == 0 and self.restart != "always":
                _log(f"{self.argv[-1]}: finished (exit 0); not restarting")
                _write(self.pidfile, self.me, None, self.argv)
                return 0
            delay = FIRST_DELAY_S if time.monotonic() - started > HEALTHY_AFTER_S else delay
            unasked = " unasked (restart: always)" if code == 0 else ""
            _log(f"daemon exited {code}{unasked}: starting it again in {delay:g}s "
                 f"({' '.join(self.argv)})")
            if self.stopping.wait(delay):
                return 0
            delay = min(MAX_DELAY_S, delay * 2)
        return 0


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp} supervise: {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.node.supervise",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("verb", choices=("run", "ensure", "stop", "status"))
    parser.add_argument("--pidfile", required=True, type=Path)
    parser.add_argument("--log", type=Path, help="ensure: the supervisor's and daemon's log")
    parser.add_argument("--restart", choices=POLICIES, default=POLICIES[0],
                        help="run, ensure: `always` also restarts a daemon that exits 0")
    parser.add_argument("--replace-config", nargs=2, metavar=("NEW", "CONFIG"),
                        help="ensure: move NEW over CONFIG, restarting the daemon when it differs")
    parser.epilog = "The daemon's argv follows `--`: ... -- python -m infra.node.autodown --config F"
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the daemon's, whatever options it has.
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.command = argv[cut + 1:]
    if args.verb in ("run", "ensure") and not args.command:
        parser.error(f"{args.verb}: give the daemon's command after `--`")
    pidfile = args.pidfile.expanduser()
    if args.verb == "run":
        return _Supervisor(args.command, pidfile, args.restart).run()
    if args.verb == "stop":
        stop(pidfile)
        return 0
    if args.verb == "status":
        print(json.dumps(status(pidfile)))
        return 0
    if args.replace_config:
        new, config = (Path(p).expanduser() for p in args.replace_config)
        _replace_config(new, config, pidfile)
    started = ensure(args.command, pidfile, (args.log or Path(f"{pidfile}.log")).expanduser(),
                     restart=args.restart)
    print("started" if started else "running")
    return 0


def _replace_config(new: Path, config: Path, pidfile: Path) -> None:
    """A daemon keeps the config it started with: a changed one means a restart with it."""
    try:
        same = new.read_bytes() == config.read_bytes()
    except OSError:
        same = False
    if not same:
        stop(pidfile)
    os.replace(new, config)


if __name__ == "__main__":
    sys.exit(main())
